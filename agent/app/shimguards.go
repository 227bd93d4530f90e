package app

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// DefaultShimContextOverhead is the device memory NVML counts for a shim process beyond its allocations
// (its CUDA context, about 0.5 GiB on current GPUs, and driver memory), left out when its reported
// residency is checked against NVML. Larger lets a client under-report by more; smaller makes honest
// clients look like under-reporters and keeps their reservations up.
const DefaultShimContextOverhead = 1 << 30

// DefaultShimHighPriorityMin is the lowest pod priority whose shim clients may run High: any pod with
// a positive PriorityClass; pods without one (priority 0) run Normal whatever their environment asks.
const DefaultShimHighPriorityMin = 1

// podResolver names the pods of shim clients; nil where schedulers do not run or the demo's simulated
// nodes have no pods (ProcRoot empty).
func podResolver(mgr ctrl.Manager, o Options) *podpid.Resolver {
	if o.SchedulerRoot == "" || o.ProcRoot == "" {
		return nil
	}
	// Pods are read uncached: the agent must not cache every pod of the cluster.
	return &podpid.Resolver{Reader: mgr.GetAPIReader(), NodeName: o.NodeName, ProcRoot: o.ProcRoot, Clock: o.Clock}
}

// shimGuards completes o.ShimGuards with what the agent knows about a client beyond its word: its pod
// (from its cgroup), which sets its connection allowance and caps its priority, and the memory NVML
// sees it use. Without a resolver (the demo) the hello's priority is trusted and peers are processes.
func shimGuards(o Options, r *podpid.Resolver) scheduler.Guards {
	g := o.ShimGuards
	g.ProcessMemory = scheduler.ProcessMemoryFrom(o.GPU)
	if r == nil {
		return g
	}
	g.PeerKey = func(pid int32) string {
		if uid, ok := podpid.UIDOf(r.ProcRoot, pid); ok {
			return "pod:" + uid
		}
		return ""
	}
	min := o.ShimHighPriorityMin
	if min == 0 {
		min = DefaultShimHighPriorityMin // 0 would let every pod run High: the same as none
	}
	g.PeerPriority = peerPriority(r, min)
	return g
}

// peerPriority allows High to a pid whose pod's priority is at least min, and Normal to every other
// pid, including one whose pod cannot be found: a lookup that fails never raises anyone. The lookup
// runs between the client's HELLO and its WELCOME, which the shim waits for 1s
// (GPUSHARE_CONNECT_TIMEOUT_MS), so a slow API server costs the client its High, never its lease.
func peerPriority(r *podpid.Resolver, min int32) func(int32) scheduler.Priority {
	return func(pid int32) scheduler.Priority {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if p, ok := r.Priority(ctx, pid); ok && p >= min {
			return scheduler.PriorityHigh
		}
		return scheduler.PriorityNormal
	}
}
