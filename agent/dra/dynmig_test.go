package dra_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// dynamicNode is a node with one H100 80GB HBM3 (its recorded MIG geometry) whose instances come from
// claims of the given profiles, with the instances given already on it.
func dynamicNode(t *testing.T, profiles []string, instances ...v1alpha1.MIGInstanceStatus) v1alpha1.GPUNodeStatus {
	t.Helper()
	inv, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	d := inv.Devices[0]
	d.UUID = "GPU-00000000-0000-0000-0000-000000000000"
	return dynamicStatus(d, profiles, instances...)
}

// dynamicStatus is the status of a node with GPU d, index 0, in dynamic MIG with the given profiles.
func dynamicStatus(d gpu.Device, profiles []string, instances ...v1alpha1.MIGInstanceStatus) v1alpha1.GPUNodeStatus {
	g := v1alpha1.GPUStatus{Index: 0, UUID: d.UUID, Product: d.Product,
		Memory: resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI), MIGMode: &v1alpha1.MIGModeStatus{Current: "Enabled", Pending: "Enabled"},
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG, MIGInstances: instances,
			MIGDynamic: &v1alpha1.DynamicMIGStatus{Profiles: profiles}},
		Conditions:  []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}},
		MIGProfiles: node.MIGProfiles(d.Profiles)}
	return v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{g}}
}

func TestADynamicGPUPublishesEachPossiblePlacementConsumingItsSlices(t *testing.T) {
	st := dynamicNode(t, []string{"1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb", "7g.80gb"})
	devs := dra.Devices(st, share.DefaultConfig())
	var got []string
	for _, d := range devs {
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != "gpu-0-mig" {
			t.Fatalf("device %s consumes %+v", d.Name, d.ConsumesCounters)
		}
		var cs []string
		for name, c := range d.ConsumesCounters[0].Counters {
			cs = append(cs, name+"="+c.Value.String())
		}
		sort.Strings(cs)
		got = append(got, d.Name+":"+strings.Join(cs, ","))
	}
	// The H100's placements as NVML reports them: 1g.10gb at 0-6, 2g.20gb at 0/2/4 on two memory slices,
	// 3g.40gb at 0/4 on four, 7g.80gb on all eight; 1g.10gb+me once only (its instance counter).
	want := []string{
		"gpu-0-mig-1g-10gb-0:compute=1,memory-slice-0=1", "gpu-0-mig-1g-10gb-1:compute=1,memory-slice-1=1",
		"gpu-0-mig-1g-10gb-2:compute=1,memory-slice-2=1", "gpu-0-mig-1g-10gb-3:compute=1,memory-slice-3=1",
		"gpu-0-mig-1g-10gb-4:compute=1,memory-slice-4=1", "gpu-0-mig-1g-10gb-5:compute=1,memory-slice-5=1",
		"gpu-0-mig-1g-10gb-6:compute=1,memory-slice-6=1",
		"gpu-0-mig-1g-10gb-me-0:compute=1,memory-slice-0=1,profile-20=1", "gpu-0-mig-1g-10gb-me-1:compute=1,memory-slice-1=1,profile-20=1",
		"gpu-0-mig-1g-10gb-me-2:compute=1,memory-slice-2=1,profile-20=1", "gpu-0-mig-1g-10gb-me-3:compute=1,memory-slice-3=1,profile-20=1",
		"gpu-0-mig-1g-10gb-me-4:compute=1,memory-slice-4=1,profile-20=1", "gpu-0-mig-1g-10gb-me-5:compute=1,memory-slice-5=1,profile-20=1",
		"gpu-0-mig-1g-10gb-me-6:compute=1,memory-slice-6=1,profile-20=1",
		"gpu-0-mig-2g-20gb-0:compute=2,memory-slice-0=1,memory-slice-1=1", "gpu-0-mig-2g-20gb-2:compute=2,memory-slice-2=1,memory-slice-3=1",
		"gpu-0-mig-2g-20gb-4:compute=2,memory-slice-4=1,memory-slice-5=1",
		"gpu-0-mig-3g-40gb-0:compute=3,memory-slice-0=1,memory-slice-1=1,memory-slice-2=1,memory-slice-3=1",
		"gpu-0-mig-3g-40gb-4:compute=3,memory-slice-4=1,memory-slice-5=1,memory-slice-6=1,memory-slice-7=1",
		"gpu-0-mig-7g-80gb-0:compute=7,memory-slice-0=1,memory-slice-1=1,memory-slice-2=1,memory-slice-3=1,memory-slice-4=1,memory-slice-5=1,memory-slice-6=1,memory-slice-7=1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("devices:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	sets := dra.Counters(st)
	if len(sets) != 1 || len(sets[0].Counters) != 10 {
		t.Fatalf("counter sets %+v; want one with 8 memory slices, compute and profile-20", sets)
	}
	if c := sets[0].Counters["compute"]; c.Value.Value() != 7 {
		t.Errorf("compute counter %s, want 7", c.Value.String())
	}
	if c := sets[0].Counters["profile-20"]; c.Value.Value() != 1 {
		t.Errorf("profile-20 counter %s, want 1", c.Value.String())
	}
}

func TestAFixedInstanceTakesItsPlacementsOutAndClaimInstancesDoNot(t *testing.T) {
	fixed := v1alpha1.MIGInstanceStatus{Profile: "3g.40gb", Placement: v1alpha1.MIGPlacement{Start: 4, Size: 4}, UUID: "MIG-fixed"}
	claimed := v1alpha1.MIGInstanceStatus{Profile: "2g.20gb", Placement: v1alpha1.MIGPlacement{Start: 0, Size: 2}, UUID: "MIG-claimed",
		Claim: &v1alpha1.MIGClaimRef{Namespace: "default", Name: "c", UID: "u"}}
	st := dynamicNode(t, []string{"2g.20gb", "3g.40gb"}, fixed, claimed)
	var names []string
	for _, d := range dra.Devices(st, share.DefaultConfig()) {
		names = append(names, d.Name)
	}
	// The fixed 3g.40gb at 4-7 is published as today's MIG device and takes 2g@4 and 3g@4 out; the claim's
	// 2g.20gb at 0 is not a device of its own (its placement device, allocated, holds its counters).
	want := "gpu-0-mig-2g-20gb-0 gpu-0-mig-2g-20gb-2 gpu-0-mig-3g-40gb-0 gpu-0-mig-fixed"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("devices %s\nwant     %s", got, want)
	}
	if devs := share.DevicesFromStatus(st, share.DefaultConfig()); len(devs) != 1 {
		t.Errorf("the device plugin lists %v; want the fixed instance only", devs)
	}
}

func TestAnUnhealthyOrDrainedDynamicGPUPublishesNoPlacement(t *testing.T) {
	st := dynamicNode(t, []string{"1g.10gb"})
	st.GPUs[0].Conditions[0].Status = metav1.ConditionFalse
	if d := dra.Devices(st, share.DefaultConfig()); len(d) != 0 || len(dra.Counters(st)) != 0 {
		t.Errorf("unhealthy: %d devices, counters %v", len(d), dra.Counters(st))
	}
	st = dynamicNode(t, []string{"1g.10gb"})
	st.GPUs[0].Drain = &v1alpha1.GPUDrainStatus{Phase: v1alpha1.DrainPhaseDraining}
	if d := dra.Devices(st, share.DefaultConfig()); len(d) != 0 {
		t.Errorf("draining: %d devices", len(d))
	}
}

// Eight dynamic H100s: their counter sets in one slice of their own, first, and their 200 placement
// devices in slices of at most 64 (the API's limit where devices consume counters).
func TestADynamicNodeIsCutIntoCounterAndDeviceSlices(t *testing.T) {
	one := dynamicNode(t, []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"})
	var st v1alpha1.GPUNodeStatus
	for i := range 8 {
		g := *one.GPUs[0].DeepCopy()
		g.Index, g.UUID = int32(i), fmt.Sprintf("GPU-%d", i)
		st.GPUs = append(st.GPUs, g)
	}
	pool := dra.Pool(dra.Devices(st, share.DefaultConfig()), dra.Counters(st)...)
	var shape []string
	for _, s := range pool.Slices {
		shape = append(shape, fmt.Sprintf("%d counters/%d devices", len(s.SharedCounters), len(s.Devices)))
	}
	if got := strings.Join(shape, " "); got != "8 counters/0 devices 0 counters/64 devices 0 counters/64 devices 0 counters/64 devices 0 counters/8 devices" {
		t.Errorf("slices %s", got)
	}
}
