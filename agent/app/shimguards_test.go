package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// The agent gives the scheduler each shim client's pod priority (which, against the GPU's production
// threshold, decides its class): its PriorityClass's value, 0 for a pod without a class, and none for
// a process in no pod. Without a resolver (the demo's simulated nodes) the hello is trusted:
// PodPriority is unset.
func TestShimClientPriorityComesFromItsPod(t *testing.T) {
	ctx := context.Background()
	// Names of this run's own: with no kubelet, a deleted pod bound to a node stays (terminating), so a
	// second run in the same API server (-count) must not reuse the first one's names.
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-gpu-high-"}, Value: 1000}
	env.PriorityClass(t, ctx, pc)
	node := "prio-node-" + pc.Name[len(pc.GenerateName):]
	root := t.TempDir()
	pod := func(name, class string, pid int32) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-", Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: node, PriorityClassName: class, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, p, client.GracePeriodSeconds(0)) })
		dir := filepath.Join(root, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cg := fmt.Sprintf("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-x.scope\n", p.UID)
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pod("prio-high", pc.Name, 50)
	pod("prio-plain", "", 51)
	r := &podpid.Resolver{Reader: env.Client, NodeName: node, ProcRoot: root}

	g := shimGuards(Options{GPU: gpu.Null{}}, r)
	for pid, want := range map[int32]struct {
		value int32
		ok    bool
	}{50: {1000, true}, 51: {0, true}, 52: {0, false}} {
		if v, ok := g.PodPriority(pid); v != want.value || ok != want.ok {
			t.Errorf("pid %d: pod priority %d (%v), want %d (%v)", pid, v, ok, want.value, want.ok)
		}
	}
	if k := g.PeerKey(50); k == "" || k == g.PeerKey(51) {
		t.Errorf("peer keys of two pods: %q and %q", k, g.PeerKey(51))
	}
	if g.GangKey(50) != g.PeerKey(50) || g.GangKey(52) != "" {
		t.Errorf("gang keys %q (pod) and %q (no pod), want the pod's peer key and none", g.GangKey(50), g.GangKey(52))
	}
	if demo := shimGuards(Options{GPU: gpu.Null{}}, nil); demo.PodPriority != nil || demo.ProcessMemory == nil ||
		demo.GangKey == nil || demo.GangKey(int32(os.Getpid())) != "" {
		t.Error("without a resolver: want the hello trusted, NVML still checked and no gangs")
	}
}
