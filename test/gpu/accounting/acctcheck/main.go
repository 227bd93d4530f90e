// Command acctcheck reads the real GPUs through the agent's accounting (agent/accounting over NVML) and
// compares each process's memory and SM utilization with nvidia-smi's per-process view, read at the
// same moments. The GPU machine has no kubelet, so processes are not named by pod here: the figures
// compared are the per-process ones every per-pod figure is summed from. test/gpu/accounting/run.sh
// runs it beside two PyTorch processes.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/test/gpu/smi"
)

func main() {
	duration := flag.Duration("duration", 30*time.Second, "how long to sample")
	interval := flag.Duration("interval", 2*time.Second, "accounting interval")
	pidList := flag.String("pids", "", "comma-separated pids that must be seen (the workloads)")
	memTol := flag.Float64("memory-tolerance", 0.05, "largest relative memory difference from nvidia-smi")
	smTol := flag.Float64("sm-tolerance", 10, "largest difference of mean SM utilization from nvidia-smi pmon, in points")
	flag.Parse()
	if err := run(*duration, *interval, *pidList, *memTol, *smTol); err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
}

type stat struct {
	ourSM, smiSM       []float64
	memChecks, memFail int
	worstMem           float64
}

func run(duration, interval time.Duration, pidList string, memTol, smTol float64) error {
	lib := nvml.New()
	if r := lib.Init(); r != nvml.SUCCESS {
		return fmt.Errorf("nvml init: %v", r)
	}
	defer func() { _ = lib.Shutdown() }() // the process exits next; nothing to do with a failed shutdown
	a := &accounting.Accountant{GPUs: gpu.NewNVML(lib)}
	want := map[int32]bool{}
	for _, f := range strings.Split(pidList, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			want[int32(n)] = true
		}
	}
	ctx := context.Background()
	stats := map[int32]*stat{}
	var cpu time.Duration
	var reads int
	end := time.Now().Add(duration)
	first := a.Sample(ctx) // the first read takes NVML's whole buffer; compare from the second on
	if len(want) > 0 && !seesAny(first, want) {
		// NVML reports pids of the host's namespace; where this runs in another, the workloads' own
		// pids are not NVML's: compare every process NVML lists instead, and say so.
		fmt.Println("note: NVML lists none of", pidList, "(another pid namespace): comparing every process it lists")
		want = map[int32]bool{}
	}
	for time.Now().Before(end) {
		time.Sleep(interval)
		c0 := cpuTime()
		snap := a.Sample(ctx)
		cpu += cpuTime() - c0
		reads++
		// nvidia-smi right after: memory is a level, so both must agree within the tolerance.
		smiMem, err := smi.Memory()
		if err != nil {
			return err
		}
		// pmon prints the latest sample per process: the window our mean covers ends there.
		smiSM, err := smi.Pmon()
		if err != nil {
			return err
		}
		for _, g := range snap.GPUs {
			if g.Err != nil {
				return fmt.Errorf("GPU %s: %w", g.UUID, g.Err)
			}
			for _, p := range g.Processes {
				if len(want) > 0 && !want[p.PID] {
					continue
				}
				s := stats[p.PID]
				if s == nil {
					s = &stat{}
					stats[p.PID] = s
				}
				if m, ok := smiMem[p.PID]; ok && p.MemoryKnown {
					s.memChecks++
					diff := smi.Rel(float64(p.MemoryBytes), float64(m))
					s.worstMem = max(s.worstMem, diff)
					if diff > memTol {
						s.memFail++
					}
					fmt.Printf("%s pid %d gpu %d: memory %d MiB (nvidia-smi %d MiB, %.2f%%)", time.Now().UTC().Format("15:04:05"), p.PID, g.Index, p.MemoryBytes>>20, m>>20, 100*diff)
				}
				if p.SMKnown {
					s.ourSM = append(s.ourSM, p.SMPercent)
					fmt.Printf(" sm %.1f%%", p.SMPercent)
				}
				if v, ok := smiSM[p.PID]; ok {
					s.smiSM = append(s.smiSM, v)
					fmt.Printf(" (pmon %.0f%%)", v)
				}
				fmt.Println()
			}
		}
	}
	fmt.Printf("reads: %d, accounting CPU per read %s (getrusage; this process)\n", reads, (cpu / time.Duration(max(reads, 1))).Round(time.Microsecond))
	var failed []string
	pids := make([]int32, 0, len(stats))
	for pid := range stats {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	for pid := range want {
		if stats[pid] == nil {
			failed = append(failed, fmt.Sprintf("pid %d never seen", pid))
		}
	}
	for _, pid := range pids {
		s := stats[pid]
		ours, theirs := smi.Mean(s.ourSM), smi.Mean(s.smiSM)
		fmt.Printf("pid %d: memory %d/%d reads within %.0f%% (worst %.2f%%); mean SM %.1f%% (ours, %d reads) vs %.1f%% (pmon, %d reads)\n",
			pid, s.memChecks-s.memFail, s.memChecks, 100*memTol, 100*s.worstMem, ours, len(s.ourSM), theirs, len(s.smiSM))
		if s.memChecks == 0 || s.memFail > 0 {
			failed = append(failed, fmt.Sprintf("pid %d memory", pid))
		}
		if len(s.ourSM) == 0 || len(s.smiSM) == 0 || math.Abs(ours-theirs) > smTol {
			failed = append(failed, fmt.Sprintf("pid %d utilization", pid))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s", strings.Join(failed, "; "))
	}
	fmt.Println("PASS per-process memory within", 100*memTol, "% and mean SM utilization within", smTol, "points of nvidia-smi")
	return nil
}

func seesAny(s accounting.Snapshot, want map[int32]bool) bool {
	for _, g := range s.GPUs {
		for _, p := range g.Processes {
			if want[p.PID] {
				return true
			}
		}
	}
	return false
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
