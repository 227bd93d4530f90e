package dra_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// migClaimPod creates a claim of the dynamic MIG class for one profile, and a pod that uses it.
func migClaimPod(t *testing.T, ctx context.Context, c client.Client, name, profile string) {
	t.Helper()
	claimPod(t, ctx, c, name, "gpusharing-mig-dynamic", `device.attributes["gpu.gpusharing.io"].migProfile == "`+profile+`"`)
}

func deletePodAndClaim(t *testing.T, ctx context.Context, c client.Client, name string) {
	t.Helper()
	for _, obj := range []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}},
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}},
	} {
		if err := c.Delete(ctx, obj, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
}

// The real kube-scheduler v1.36.3 packs claims of 1g, 2g and 3g profiles onto one dynamic H100 on the
// placements NVML offers, as long as the counters of every memory slice a placement covers are free.
func TestTheSchedulerPacksDynamicMIGClaimsOntoValidPlacements(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	st := dynamicNode(t, []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"})
	p := startPublisher(t, env, dra.PublisherOptions{})
	p.PublishStatus(nodeOf(st))
	waitPublished(t, ctx, c, devicesOf(st))
	startScheduler(t, env)
	startClaimController(t, env)

	// 3g takes slices 0-3, 2g the first free pair (4-5), 1g the first free single slice (6).
	for _, tt := range []struct{ name, profile, want string }{
		{"a-3g", "3g.40gb", "gpu-0-mig-3g-40gb-0"},
		{"b-2g", "2g.20gb", "gpu-0-mig-2g-20gb-4"},
		{"c-1g", "1g.10gb", "gpu-0-mig-1g-10gb-6"},
	} {
		migClaimPod(t, ctx, c, tt.name, tt.profile)
		if got := allocated(t, ctx, c, tt.name); got != tt.want {
			t.Fatalf("claim %s (%s) got %s, want %s", tt.name, tt.profile, got, tt.want)
		}
	}
	// Memory slice 7 and one compute slice are free, but no 1g.10gb placement covers slice 7: the claim
	// fits the free total and waits, with the scheduler's reason.
	migClaimPod(t, ctx, c, "d-1g", "1g.10gb")
	msg := pendingReason(t, ctx, c, "d-1g")
	t.Logf("1g.10gb with slice 7 free: PodScheduled=False: %s", msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod d-1g is pending with %q; want the scheduler's reason about claims", msg)
	}
	// A 7g claim waits too: the GPU is not empty.
	migClaimPod(t, ctx, c, "e-7g", "7g.80gb")
	if msg := pendingReason(t, ctx, c, "e-7g"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod e-7g is pending with %q", msg)
	}

	// Deleting the 2g claim frees exactly slices 4-5 and two compute slices: the waiting 1g lands at 4,
	// a new 1g at 5, and a 2g finds no free pair.
	deletePodAndClaim(t, ctx, c, "b-2g")
	if got := allocated(t, ctx, c, "d-1g"); got != "gpu-0-mig-1g-10gb-4" {
		t.Errorf("claim d-1g got %s after b-2g was deleted, want gpu-0-mig-1g-10gb-4", got)
	}
	migClaimPod(t, ctx, c, "f-1g", "1g.10gb")
	if got := allocated(t, ctx, c, "f-1g"); got != "gpu-0-mig-1g-10gb-5" {
		t.Errorf("claim f-1g got %s, want gpu-0-mig-1g-10gb-5", got)
	}
	migClaimPod(t, ctx, c, "g-2g", "2g.20gb")
	if msg := pendingReason(t, ctx, c, "g-2g"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod g-2g is pending with %q", msg)
	}

	// Emptied, the GPU takes the 7g claim (the pending 2g competes for it; delete it first).
	for _, name := range []string{"g-2g", "a-3g", "c-1g", "d-1g", "f-1g"} {
		deletePodAndClaim(t, ctx, c, name)
	}
	if got := allocated(t, ctx, c, "e-7g"); got != "gpu-0-mig-7g-80gb-0" {
		t.Errorf("claim e-7g got %s on the emptied GPU, want gpu-0-mig-7g-80gb-0", got)
	}
}

func nodeOf(st v1alpha1.GPUNodeStatus) *v1alpha1.GPUNode {
	return &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: nodeName}, Status: st}
}

// devicesOf is the names of the devices st publishes, sorted and joined as waitPublished wants them.
func devicesOf(st v1alpha1.GPUNodeStatus) string {
	var names []string
	for _, d := range dra.Devices(st, share.DefaultConfig()) {
		names = append(names, d.Name)
	}
	return strings.Join(names, " ")
}
