// Command umcheck runs, on a real GPU, the parts of the agent that find unmanaged processes: the shim's
// scheduler on the GPU's socket (agent/scheduler), the accounting over real NVML (agent/accounting) with
// the scheduler's connected clients, and the unmanaged check (agent/guard) on every read, as the agent
// does while a shim GPU is checked. The GPU machine has no kubelet, so a process is "of a pod" when its
// environment has UMCHECK_POD=<name> (the agent names pods from cgroups instead); any other process is the
// host's. test/gpu/unmanaged/run.sh runs it beside a client under the shim, a process of a pod without
// LD_PRELOAD and a host process.
//
// It prints one line per read and, at the end, one PASS/FAIL line per check: every pod in -expect-named
// is named within -grace plus one read of NVML first listing it; no pod in -never is ever named; the host
// process is never named. Exit status 1 on any FAIL.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

func main() {
	dir := flag.String("socket-dir", "", "directory for the GPU's socket, <dir>/<uuid>.sock")
	uuid := flag.String("gpu", "", "the GPU's uuid")
	duration := flag.Duration("duration", 40*time.Second, "how long to read")
	interval := flag.Duration("interval", guard.CheckInterval, "accounting interval (the agent's while a GPU is checked)")
	grace := flag.Duration("grace", guard.DefaultUnmanagedGrace, "the check's grace (--unmanaged-grace)")
	expect := flag.String("expect-named", "", "comma-separated pods that must be named")
	never := flag.String("never", "", "comma-separated pods that must never be named")
	flag.Parse()
	if *dir == "" || *uuid == "" {
		fmt.Println("FAIL -socket-dir and -gpu are required")
		os.Exit(2)
	}
	if err := run(nvml.New(), *dir, *uuid, *duration, *interval, *grace, split(*expect), split(*never)); err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// envNamer names a pid's pod from UMCHECK_POD in its environment.
type envNamer struct{}

func (envNamer) Refs(_ context.Context, pids []int32) map[int32]podpid.Ref {
	out := map[int32]podpid.Ref{}
	for _, pid := range pids {
		env, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if name, ok := strings.CutPrefix(string(kv), "UMCHECK_POD="); ok {
				out[pid] = podpid.Ref{Namespace: "umcheck", Name: name, Container: "main", UID: fmt.Sprintf("uid-%s-%d", name, pid)}
			}
		}
	}
	return out
}

// shimSource lists the scheduler's connected clients for the accounting.
type shimSource struct{ s *scheduler.Scheduler }

func (s shimSource) ShimClients(uuid string) []accounting.ShimClient {
	var out []accounting.ShimClient
	for _, c := range s.s.Clients(uuid) {
		out = append(out, accounting.ShimClient{PID: c.PID, LockWait: c.WaitTime, LockHold: c.HoldTime, SwappedBytes: c.SwappedBytes, ResidentBytes: c.ResidentBytes})
	}
	return out
}

func run(lib nvml.Interface, dir, uuid string, duration, interval, grace time.Duration, expect, never []string) error {
	if r := lib.Init(); r != nvml.SUCCESS {
		return fmt.Errorf("nvml init: %v", r)
	}
	defer func() { _ = lib.Shutdown() }() // the process exits next
	cfg := scheduler.GPUConfig{UUID: uuid, SocketPath: filepath.Join(dir, uuid+".sock"), Quantum: 2 * time.Second}.WithDefaults()
	s, err := scheduler.New(scheduler.Options{GPUs: []scheduler.GPUConfig{cfg}, RebuildWindow: -1})
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := s.Listen(ctx); err != nil {
		return err
	}
	defer s.Close()
	fmt.Printf("umcheck: socket %s, grace %v, reads every %v\n", cfg.SocketPath, grace, interval)

	a := &accounting.Accountant{GPUs: gpu.NewNVML(lib), Pods: envNamer{}, Shim: shimSource{s}}
	u := &guard.Unmanaged{Grace: grace}
	kinds := map[string]guard.Kind{uuid: guard.KindShim}
	listed, named := map[string]time.Time{}, map[string]time.Time{}
	maxClients, maxHost := 0, 0
	start := time.Now()
	// As the agent's pass that started the scheduler: reads from now on count.
	u.Judge(accounting.Snapshot{At: start.Add(-time.Millisecond)}, kinds)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ; time.Since(start) < duration; <-tick.C {
		snap := a.Sample(ctx)
		v := u.Judge(snap, kinds)[uuid]
		if g, ok := snap.GPU(uuid); ok {
			for _, p := range g.Processes {
				if _, seen := listed[p.Pod.Name]; p.Pod.Name != "" && !seen && p.Shim == nil {
					listed[p.Pod.Name] = snap.At
				}
			}
		}
		var names []string
		for _, p := range v.Named {
			names = append(names, fmt.Sprintf("%s:%d(%dMiB)", p.Name, p.PID, p.MemoryBytes>>20))
			if _, ok := named[p.Name]; !ok {
				named[p.Name] = snap.At
			}
		}
		maxClients, maxHost = max(maxClients, v.Clients), max(maxHost, v.Host)
		fmt.Printf("t=%5.1fs read=%t clients=%d host=%d waiting=%d named=[%s]\n", time.Since(start).Seconds(), v.Read, v.Clients, v.Host,
			v.Waiting, strings.Join(names, " "))
	}
	return report(listed, named, expect, never, grace, interval, maxClients, maxHost)
}

func report(listed, named map[string]time.Time, expect, never []string, grace, interval time.Duration, clients, host int) error {
	fails := 0
	check := func(ok bool, format string, args ...any) {
		word := "PASS"
		if !ok {
			word, fails = "FAIL", fails+1
		}
		fmt.Printf("%s %s\n", word, fmt.Sprintf(format, args...))
	}
	// Listed by NVML at most one read after its context; named at the first read past the grace after that.
	bound := grace + interval
	for _, pod := range expect {
		at, ok := named[pod]
		first, seen := listed[pod]
		check(ok && seen && at.Sub(first) <= bound, "%s (no LD_PRELOAD) named %v after NVML first listed it unmanaged (bound %v: the grace and one read; %v from its context)",
			pod, at.Sub(first).Round(10*time.Millisecond), bound, bound+interval)
	}
	for _, pod := range never {
		_, ok := named[pod]
		check(!ok, "%s (under the shim) never named", pod)
	}
	var extra []string
	for pod := range named {
		if !contains(expect, pod) {
			extra = append(extra, pod)
		}
	}
	sort.Strings(extra)
	check(len(extra) == 0, "nothing else named (host processes are counted, never named): %v", extra)
	check(clients >= len(never), "the shim's clients counted as clients: up to %d at a read", clients)
	check(host >= 1, "host processes counted: up to %d at a read", host)
	if fails > 0 {
		return fmt.Errorf("%d checks failed", fails)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
