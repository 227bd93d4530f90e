package deviceplugin

import (
	"path/filepath"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
)

// A drained GPU's pods still count against the node in the scheduler's books, so their devices must
// still count in its allocatable: otherwise a replacement that fits on another GPU of the node stays
// Pending until the drain ends (found with a real kubelet in the e2e's Drain scenario). The devices no pod
// holds leave at once, a held one leaves when its pod is gone, and the kubelet can have none of them.
func TestCordonKeepsTheDevicesPodsHoldAdvertisedUntilThePodsGo(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	pr, err := fakekubelet.StartPodResources(filepath.Join(dir, "pr.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pr.Stop)
	lister, closeLister, err := vacate.DialPodResources(pr.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeLister() })
	m := runManager(t, testConfig(dir))
	m.SetPodResources(lister)
	a0, a1, b0, b1 := share.ReplicaID("GPU-a", 0), share.ReplicaID("GPU-a", 1), share.ReplicaID("GPU-b", 0), share.ReplicaID("GPU-b", 1)
	pr.SetPods(
		fakekubelet.Pod("default", "on-a", resTimeSlice, a1),
		fakekubelet.Pod("default", "on-b", resTimeSlice, b0),
		// The same ID under another resource is not this resource's device.
		fakekubelet.Pod("default", "elsewhere", resMPS, a0),
	)
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)))); err != nil {
		t.Fatal(err)
	}
	if err := m.Cordon(ctx, "GPU-a"); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy(a1, b0, b1)); err != nil {
		t.Fatalf("kubelet's view with GPU-a cordoned and its replica 1 held: %v", err)
	}
	p := dialPlugin(t, k, resTimeSlice)
	if _, err := p.AllocateOne(ctx, a1); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate of a held device of a cordoned GPU: got %v, want InvalidArgument", err)
	}
	if got, err := p.Preferred(ctx, []string{a1, b1}, nil, 1); err != nil || !reflect.DeepEqual(got, []string{b1}) {
		t.Errorf("preferred allocation from %v: got %v, %v; want %v (never the cordoned GPU's)", []string{a1, b1}, got, err, []string{b1})
	}

	// The pod on GPU-a ends: its device leaves at the next kubelet poll.
	pr.RemovePod("default", "on-a")
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy(b0, b1)); err != nil {
		t.Errorf("kubelet's view after the last pod on GPU-a ended: %v", err)
	}

	// A kubelet that cannot answer: nothing of a cordoned GPU is advertised (the old, safe accounting).
	pr.SetPods(fakekubelet.Pod("default", "on-a", resTimeSlice, a0))
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy(a0, b0, b1)); err != nil {
		t.Fatal(err)
	}
	pr.Stop()
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy(b0, b1)); err != nil {
		t.Errorf("with the PodResources API gone: %v", err)
	}

	if err := m.Uncordon(ctx, "GPU-a"); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy(a0, a1, b0, b1)); err != nil {
		t.Errorf("after Uncordon: %v", err)
	}
	for _, d := range m.Advertised()[resTimeSlice] {
		if d.Held {
			t.Errorf("%s still marked held after Uncordon", d.ID)
		}
	}
}
