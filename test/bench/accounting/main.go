// Command accounting measures the agent's CPU for per-pod accounting: the accountant reads a mock DGX
// H100's GPUs with their processes (NVML lists, utilization samples, pod names from cgroup files
// through podpid, the shim clients) back to back, and the CPU time per read is set against the
// default interval. Run it with `make bench-accounting` (BENCH_ARGS="-gpus 8 -procs 64 -reads 2000").
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

func main() {
	gpus := flag.Int("gpus", 8, "GPUs of the mock node (1-8)")
	procs := flag.Int("procs", 64, "processes, each in its own pod, spread over the GPUs")
	reads := flag.Int("reads", 2000, "reads to time")
	interval := flag.Duration("interval", accounting.DefaultInterval, "the accounting interval the CPU time is set against")
	flag.Parse()
	if err := run(*gpus, *procs, *reads, *interval); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(gpus, procs, reads int, interval time.Duration) error {
	srv, err := nvmlmock.NewNode("H100", gpus, 0)
	if err != nil {
		return err
	}
	procRoot, err := os.MkdirTemp("", "bench-accounting-proc")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(procRoot) }()
	var pods []corev1.Pod
	byGPU := make([][]nvmlmock.Process, gpus)
	shim := shimClients{}
	for i := 0; i < procs; i++ {
		pid := uint32(10000 + i)
		uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
		cid := strings.Repeat(fmt.Sprintf("%08x", i), 8)
		cg := fmt.Sprintf("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope\n", strings.ReplaceAll(uid, "-", "_"), cid)
		dir := filepath.Join(procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			return err
		}
		p := corev1.Pod{}
		p.Namespace, p.Name, p.UID = "bench", fmt.Sprintf("pod-%d", i), types.UID(uid)
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + cid}}
		pods = append(pods, p)
		g := i % gpus
		byGPU[g] = append(byGPU[g], nvmlmock.Proc(pid, uint64(1+i%8)<<30, uint32(10+i%50)))
		uuid := srv.GPUs[g].UUID
		shim[uuid] = append(shim[uuid], accounting.ShimClient{PID: int32(pid), LockWait: time.Second, LockHold: time.Second})
	}
	for g := range byGPU {
		srv.GPUs[g].SetUsage(byGPU[g]...)
	}
	a := &accounting.Accountant{
		GPUs: gpu.NewNVML(srv),
		Pods: &podpid.Resolver{Reader: podList(pods), NodeName: "bench", ProcRoot: procRoot},
		Shim: shim,
	}
	ctx := context.Background()
	// One read outside the timing: the pod list and the first samples.
	for _, g := range srv.GPUs {
		g.AdvanceSamples(uint64(interval.Microseconds()))
	}
	if snap := a.Sample(ctx); len(snap.GPUs) != gpus || countContainers(snap) != procs {
		return fmt.Errorf("the warm-up read saw %d GPUs and %d containers, want %d and %d", len(snap.GPUs), countContainers(snap), gpus, procs)
	}
	before, start := cpuTime(), time.Now()
	for i := 0; i < reads; i++ {
		for _, g := range srv.GPUs {
			g.AdvanceSamples(uint64(interval.Microseconds()))
		}
		a.Sample(ctx)
	}
	cpu, wall := cpuTime()-before, time.Since(start)
	perRead := cpu / time.Duration(reads)
	fmt.Printf("command: go run ./test/bench/accounting -gpus %d -procs %d -reads %d -interval %s\n", gpus, procs, reads, interval)
	fmt.Printf("reads: %d in %s wall, %s CPU (user+system, getrusage)\n", reads, wall.Round(time.Millisecond), cpu.Round(time.Millisecond))
	fmt.Printf("CPU per read: %s; at one read per %s: %.4f%% of one core (budget 2%%)\n", perRead, interval, 100*perRead.Seconds()/interval.Seconds())
	if perRead.Seconds()/interval.Seconds() >= 0.02 {
		return fmt.Errorf("over budget")
	}
	return nil
}

func countContainers(s accounting.Snapshot) int {
	n := 0
	for _, g := range s.GPUs {
		n += len(g.Containers)
	}
	return n
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type shimClients map[string][]accounting.ShimClient

func (s shimClients) ShimClients(uuid string) []accounting.ShimClient { return s[uuid] }

// podList serves the node's pods as the API server would to the resolver's one list.
type podList []corev1.Pod

func (p podList) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return fmt.Errorf("not served")
}

func (p podList) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l, ok := list.(*corev1.PodList)
	if !ok {
		return fmt.Errorf("only pods are served")
	}
	l.Items = append([]corev1.Pod(nil), p...)
	return nil
}
