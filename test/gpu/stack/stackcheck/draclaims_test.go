package main

import (
	"errors"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const testNode = "gpu-node"

// sizedStatus is a node whose GPU index (80 GiB) is sized per claim under MPS x4, as the agent reports
// it; its other GPU is whole.
func sizedStatus(index int32) v1alpha1.GPUNodeStatus {
	healthy := []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}
	return v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{
		{Index: index, UUID: "GPU-d67ebd98-fa09-34b8-a05d-f46a7e4b72c9", Product: "NVIDIA H100 80GB HBM3", Memory: resource.NewQuantity(80<<30, resource.BinarySI),
			Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: v1alpha1.MPSDaemonRunning, Replicas: 4},
				Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}},
			Conditions: healthy},
		{Index: index + 1, UUID: "GPU-00000001-0000-0000-0000-000000000000", Product: "NVIDIA H100 80GB HBM3", Memory: resource.NewQuantity(80<<30, resource.BinarySI),
			Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive}, Conditions: healthy},
	}}
}

// sizedDeviceOf is the agent's sized device of GPU index in sizedStatus.
func sizedDeviceOf(t *testing.T, index int32) resourcev1.Device {
	t.Helper()
	for _, d := range dra.Devices(sizedStatus(index), share.DefaultConfig()) {
		if attrString(d, dra.AttrShare) == dra.ShareSized {
			return d
		}
	}
	t.Fatal("the agent publishes no sized device for a GPU sized per claim")
	return resourcev1.Device{}
}

// What a claim consumes of the agent's sized device, as kube-scheduler computes it: a request raised to
// the minimum and rounded up to the step, the policy's default where nothing is asked (a fixed share of
// the replicas), and nothing past the capacity.
func TestConsumedCapacityIsTheSchedulers(t *testing.T) {
	dev := sizedDeviceOf(t, 0)
	q := resource.MustParse
	for _, tt := range []struct {
		name          string
		requests      map[resourcev1.QualifiedName]resource.Quantity
		memory        string
		compute       int64
		doesNotFitErr bool
	}{
		{name: "on the grid", requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: q("8Gi"), dra.CapacityCompute: q("25")}, memory: "8Gi", compute: 25},
		{name: "rounded up to the 1Gi step", requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: q("3500Mi"), dra.CapacityCompute: q("50")}, memory: "4Gi", compute: 50},
		{name: "raised to the minimum", requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: q("100Mi")}, memory: "1Gi", compute: 25},
		{name: "the defaults of 4 replicas", requests: nil, memory: "20Gi", compute: 25},
		{name: "more memory than the GPU", requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: q("81Gi")}, doesNotFitErr: true},
		{name: "more than all SMs", requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityCompute: q("101")}, doesNotFitErr: true},
		{name: "a capacity the device lacks", requests: map[resourcev1.QualifiedName]resource.Quantity{"bandwidth": q("1")}, doesNotFitErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := consumedCapacity(dev, tt.requests)
			if tt.doesNotFitErr {
				if !errors.Is(err, errDoesNotFit) {
					t.Fatalf("consumed %v, err %v; want errDoesNotFit", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mem, compute := got[dra.CapacityMemory], got[dra.CapacityCompute]
			if len(got) != 2 || mem.Cmp(q(tt.memory)) != 0 || compute.Value() != tt.compute {
				t.Fatalf("consumed %v, want memory %s and compute %d", got, tt.memory, tt.compute)
			}
		})
	}
}

func slice(name, node string, generation, count int64, devs ...resourcev1.Device) resourcev1.ResourceSlice {
	return resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: dra.DriverName, NodeName: ptr.To(node), Pool: resourcev1.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: count}, Devices: devs}}
}

// The sized device is found by its attributes in the pool's newest generation, once all of that
// generation's slices are there; slices of other nodes or drivers and older generations are not read,
// whatever their names.
func TestFindSizedDeviceReadsTheNewestCompletePool(t *testing.T) {
	sized := sizedDeviceOf(t, 3)
	renamed := sized.DeepCopy()
	renamed.Name = "any-name"
	whole := dra.Devices(sizedStatus(3), share.DefaultConfig())
	otherDriver := slice("x", testNode, 9, 1, sized)
	otherDriver.Spec.Driver = "gpu.nvidia.com"
	for _, tt := range []struct {
		name   string
		slices []resourcev1.ResourceSlice
		found  string
	}{
		{name: "one slice", slices: []resourcev1.ResourceSlice{slice("a", testNode, 1, 1, whole...)}, found: sized.Name},
		{name: "by attributes, not name", slices: []resourcev1.ResourceSlice{slice("a", testNode, 1, 1, *renamed)}, found: "any-name"},
		{name: "an older generation is not read", slices: []resourcev1.ResourceSlice{slice("a", testNode, 1, 1, sized), slice("b", testNode, 2, 1)}},
		{name: "a generation not complete yet", slices: []resourcev1.ResourceSlice{slice("a", testNode, 2, 2, sized)}},
		{name: "a complete generation of two slices", slices: []resourcev1.ResourceSlice{slice("a", testNode, 2, 2), slice("b", testNode, 2, 2, sized)}, found: sized.Name},
		{name: "another node's", slices: []resourcev1.ResourceSlice{slice("a", "other", 1, 1, sized)}},
		{name: "another driver's", slices: []resourcev1.ResourceSlice{otherDriver}},
		{name: "another GPU's", slices: []resourcev1.ResourceSlice{slice("a", testNode, 1, 1, sizedDeviceOf(t, 4))}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, ok, err := findSizedDevice(tt.slices, testNode, 3)
			if err != nil || ok != (tt.found != "") || (ok && (d.dev.Name != tt.found || d.pool != testNode)) {
				t.Fatalf("found %v %q in pool %q (%v), want %q", ok, d.dev.Name, d.pool, err, tt.found)
			}
		})
	}
	if _, _, err := findSizedDevice([]resourcev1.ResourceSlice{slice("a", testNode, 1, 1, sized, *renamed)}, testNode, 3); err == nil {
		t.Fatal("two sized devices of one GPU: no error")
	}
}
