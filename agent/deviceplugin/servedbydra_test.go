package deviceplugin

import (
	"testing"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
)

// Where DRA serves extended resources (DeviceClasses naming them), a name advertised by the device plugin
// too would hand one share to a device plugin pod and a claim at once: the manager waits to learn which
// names DRA serves, never advertises those, and advertises a name again once no class maps it.
func TestResourcesServedByDRAAreNeverAdvertised(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m, err := NewManager(testConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	m.AwaitServedByDRA()
	st := sharetest.NodeStatus(sharetest.GPU(0, "GPU-ex"), sharetest.GPU(1, "GPU-ts", sharetest.TimeSliced(2)))
	if err := m.UpdateFromStatus(ctx, st); err != nil {
		t.Fatal(err)
	}
	if got := m.Advertised(); len(got) != 0 {
		t.Fatalf("before it knows what DRA serves the manager advertises %v, want nothing", got)
	}

	if err := m.SetServedByDRA(ctx, map[share.ResourceName]bool{resTimeSlice: true}); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-ex")); err != nil {
		t.Fatalf("the name DRA does not serve: %v", err)
	}
	if _, ok := m.Advertised()[resTimeSlice]; ok {
		t.Errorf("%s is served by DRA and still advertised: %v", resTimeSlice, m.Advertised())
	}
	if n := len(k.Registrations(resTimeSlice)); n != 0 {
		t.Errorf("%s registered %d times with the kubelet, want never", resTimeSlice, n)
	}
	// A later status keeps it withheld.
	if err := m.UpdateFromStatus(ctx, st); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Advertised()[resTimeSlice]; ok {
		t.Errorf("after another status %s is advertised", resTimeSlice)
	}

	if err := m.SetServedByDRA(ctx, map[share.ResourceName]bool{}); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy("GPU-ts::0", "GPU-ts::1")); err != nil {
		t.Errorf("once no class maps %s: %v", resTimeSlice, err)
	}
}
