package app

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

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
// (from its cgroup), which sets its connection allowance, makes its clients on several GPUs one gang
// and whose priority decides its class (production or opportunistic, against the GPU's threshold), and
// the memory NVML sees it use. Without a resolver (the demo) the hello's priority is trusted, peers are
// processes and there are no gangs (the standalone scheduler's sessions mean nothing in an agent).
func shimGuards(o Options, r *podpid.Resolver) scheduler.Guards {
	g := o.ShimGuards
	g.ProcessMemory = scheduler.ProcessMemoryFrom(o.GPU)
	g.GangKey = func(int32) string { return "" }
	if r == nil {
		return g
	}
	g.PeerKey = func(pid int32) string {
		if uid, ok := podpid.UIDOf(r.ProcRoot, pid); ok {
			return "pod:" + uid
		}
		return ""
	}
	// A pod's clients on several GPUs are one gang (scheduler/gang.go); a process in no pod is in none.
	g.GangKey = g.PeerKey
	g.ProcRoot = r.ProcRoot
	g.PodPriority = podPriority(r)
	return g
}

// podPriority is the resolved priority of pid's pod; ok is false for a pid in no pod, or in one that
// cannot be found, which the scheduler then runs opportunistic: a lookup that fails never makes anyone
// production. The lookup runs between the client's HELLO and its WELCOME, which the shim waits for 1s
// (GPUSHARE_CONNECT_TIMEOUT_MS), so a slow API server costs the client its class, never its lease.
func podPriority(r *podpid.Resolver) func(int32) (int32, bool) {
	return func(pid int32) (int32, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return r.Priority(ctx, pid)
	}
}

// claimPodPriority reads a pod's resolved priority through the API server (uncached: the agent caches its own
// node's objects only), for the DRA kubelet plugin's production classes on MPS and shim GPUs.
func claimPodPriority(reader client.Reader) func(ctx context.Context, namespace, name string) (int32, bool) {
	return func(ctx context.Context, namespace, name string) (int32, bool) {
		var pod corev1.Pod
		if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
			return 0, false
		}
		if pod.Spec.Priority == nil {
			return 0, true // as the kube-scheduler treats a pod without one
		}
		return *pod.Spec.Priority, true
	}
}
