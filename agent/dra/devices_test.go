package dra

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func gpu(i int, applied *v1alpha1.AppliedSharing) v1alpha1.GPUStatus {
	return v1alpha1.GPUStatus{Index: int32(i), UUID: fmt.Sprintf("GPU-%d", i), Product: "NVIDIA H100 80GB HBM3",
		Memory: resource.NewQuantity(80<<30, resource.BinarySI), Applied: applied,
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}}
}

func attrs(d resourcev1.Device) string {
	var parts []string
	for _, k := range []resourcev1.QualifiedName{AttrShare, AttrStrategy, AttrReplicas, AttrMIGProfile, AttrMPSThreads, AttrMPSMemoryMiB, AttrOversubscribed} {
		a, ok := d.Attributes[k]
		switch {
		case !ok:
		case a.StringValue != nil:
			parts = append(parts, fmt.Sprintf("%s=%s", k, *a.StringValue))
		case a.IntValue != nil:
			parts = append(parts, fmt.Sprintf("%s=%d", k, *a.IntValue))
		case a.BoolValue != nil && *a.BoolValue:
			parts = append(parts, string(k))
		}
	}
	if c, ok := d.Capacity[CapacityMemory]; ok {
		parts = append(parts, "memory="+c.Value.String())
	}
	return d.Name + " " + strings.Join(parts, " ")
}

func TestDevicesPublishEachKindOfShareWithItsAttributes(t *testing.T) {
	pinned := resource.MustParse("8Gi")
	budget := resource.MustParse("60Gi")
	g0 := gpu(0, &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG, MIGInstances: []v1alpha1.MIGInstanceStatus{{Profile: "3g.40gb", UUID: "MIG-a1"}}})
	g0.MIGProfiles = []v1alpha1.MIGProfile{{Name: "3g.40gb", Memory: resource.NewQuantity(40448<<20, resource.BinarySI)}}
	g0.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled"}
	st := v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{
		g0,
		gpu(1, &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 2, ActiveThreadPercentage: 50, PinnedMemoryLimit: &pinned}}),
		gpu(2, &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2}, Shim: &v1alpha1.ShimStatus{MemoryBudget: &budget}}),
		gpu(3, &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive}),
	}}
	var got []string
	for _, d := range Devices(st, share.DefaultConfig()) {
		got = append(got, attrs(d))
	}
	want := []string{
		"gpu-0-mig-a1 share=MIG strategy=MIG replicas=1 migProfile=3g.40gb memory=40448Mi",
		"gpu-1-mps-0 share=MPS strategy=MPS replicas=2 mpsActiveThreadPercentage=50 mpsPinnedMemoryLimitMiB=8192 memory=8Gi",
		"gpu-1-mps-1 share=MPS strategy=MPS replicas=2 mpsActiveThreadPercentage=50 mpsPinnedMemoryLimitMiB=8192 memory=8Gi",
		"gpu-2-shared-0 share=Shared strategy=TimeSlicing replicas=2 oversubscription",
		"gpu-2-shared-1 share=Shared strategy=TimeSlicing replicas=2 oversubscription",
		"gpu-3 share=Exclusive strategy=Exclusive replicas=1 memory=80Gi",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("devices:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestUnhealthyAndDrainingGPUsPublishNothing(t *testing.T) {
	sick := gpu(0, nil)
	sick.Conditions[0].Status = metav1.ConditionFalse
	draining := gpu(1, nil)
	draining.Drain = &v1alpha1.GPUDrainStatus{Phase: v1alpha1.DrainPhaseDraining}
	// A drain that timed out left the GPU as it was: the device plugin advertises it again, so does DRA.
	timedOut := gpu(3, nil)
	timedOut.Drain = &v1alpha1.GPUDrainStatus{Phase: v1alpha1.DrainPhaseTimedOut}
	devs := Devices(v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{sick, draining, gpu(2, nil), timedOut}}, share.DefaultConfig())
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if strings.Join(names, " ") != "gpu-2 gpu-3" {
		t.Errorf("devices = %v, want gpu-2 and gpu-3", names)
	}
}

// go-nvml's mock gives every GPU's MIG instances the same uuids: the names stay distinct per GPU, and an
// instance repeated on one GPU is published once (a slice with a name twice is refused whole).
func TestMIGDeviceNamesAreUniqueWhereUUIDsRepeat(t *testing.T) {
	mig := func(i int, uuids ...string) v1alpha1.GPUStatus {
		a := &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG}
		for _, u := range uuids {
			a.MIGInstances = append(a.MIGInstances, v1alpha1.MIGInstanceStatus{Profile: "1g.10gb", UUID: u})
		}
		g := gpu(i, a)
		g.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled"}
		return g
	}
	devs := Devices(v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{mig(0, "MIG-1-gi0-ci0", "MIG-1-gi1-ci0"), mig(1, "MIG-1-gi0-ci0", "MIG-1-gi0-ci0")}}, share.DefaultConfig())
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if got := strings.Join(names, " "); got != "gpu-0-mig-1-gi0-ci0 gpu-0-mig-1-gi1-ci0 gpu-1-mig-1-gi0-ci0" {
		t.Errorf("devices %s", got)
	}
}

func TestOfGPUTellsAGPUsDevicesByName(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"gpu-1", true}, {"gpu-1-mps-3", true}, {"gpu-1-mig-1-gi0-ci0", true}, {"gpu-1-timeslicing-0", true},
		{"gpu-10", false}, {"gpu-10-mps-0", false}, {"gpu-2", false}, {"xgpu-1", false},
	} {
		if got := OfGPU(tt.name, 1); got != tt.want {
			t.Errorf("OfGPU(%q, 1) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func sizedGPU(i int, memory string, a *v1alpha1.AppliedSharing, step, minimum string) v1alpha1.GPUStatus {
	g := gpu(i, a)
	m := resource.MustParse(memory)
	g.Memory = &m
	a.Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}
	if step != "" {
		q := resource.MustParse(step)
		a.Sizing.MemoryStep = &q
	}
	if minimum != "" {
		q := resource.MustParse(minimum)
		a.Sizing.MinMemory = &q
	}
	return g
}

// sizedCapacity renders a capacity with its request policy: "memory=40Gi default=10Gi min=1Gi step=1Gi".
func sizedCapacity(d resourcev1.Device, name resourcev1.QualifiedName) string {
	c, ok := d.Capacity[name]
	if !ok {
		return "none"
	}
	s := fmt.Sprintf("%s=%s", name, c.Value.String())
	if p := c.RequestPolicy; p != nil {
		s += " default=" + p.Default.String()
		if r := p.ValidRange; r != nil {
			s += " min=" + r.Min.String() + " step=" + r.Step.String()
			if r.Max != nil {
				s += " max=" + r.Max.String()
			}
		}
	}
	return s
}

// A GPU sized per claim is one device many claims share, with memory and compute each consumed by a
// request policy (a capacity without one would be taken whole by every claim). A claim that asks nothing
// gets a fixed share's size: the memory over the replicas on the step grid, 100/replicas percent.
func TestASizedGPUIsOneDeviceWithConsumableMemoryAndCompute(t *testing.T) {
	budget := resource.MustParse("38Gi")
	st := v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{
		sizedGPU(0, "40Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 3}}, "", ""),
		sizedGPU(1, "80Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4},
			Shim: &v1alpha1.ShimStatus{MemoryBudget: &budget}}, "2Gi", "4Gi"),
		sizedGPU(2, "40Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive, Shim: &v1alpha1.ShimStatus{}}, "512Mi", "30Gi"),
		// Not published: a daemon down, a step the GPU cannot hold twice, nothing that enforces a size.
		sizedGPU(3, "40Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Restarting", Replicas: 3}}, "", ""),
		sizedGPU(4, "40Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 3}}, "24Gi", ""),
		sizedGPU(5, "40Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2}}, "", ""),
	}}
	var got []string
	for _, d := range Devices(st, share.DefaultConfig()) {
		multi := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		got = append(got, fmt.Sprintf("%s multi=%v enforced=%s | %s | %s", attrs(d), multi,
			*d.Attributes[AttrSizeEnforcement].StringValue, sizedCapacity(d, CapacityMemory), sizedCapacity(d, CapacityCompute)))
	}
	want := []string{
		// 40Gi/3 = 13.33Gi, down to the 1Gi grid.
		"gpu-0-sized share=Sized strategy=MPS replicas=3 memory=40Gi multi=true enforced=MPS | memory=40Gi default=13Gi min=1Gi step=1Gi | compute=100 default=33 min=1 step=1",
		"gpu-1-sized share=Sized strategy=TimeSlicing replicas=4 oversubscription memory=80Gi multi=true enforced=ShimMemory | memory=80Gi default=20Gi min=4Gi step=2Gi | compute=100 default=25 min=1 step=1",
		// ShimReplicas (4) of 40Gi is 10Gi, below the 30Gi minimum: the minimum.
		"gpu-2-sized share=Sized strategy=Exclusive replicas=4 memory=40Gi multi=true enforced=ShimMemory | memory=40Gi default=30Gi min=30Gi step=512Mi | compute=100 default=25 min=1 step=1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("devices:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The device plugin's shares of a sized GPU are not published beside it.
	if sh := Shares(st, share.DefaultConfig()); len(sh) != 3 || !sh["gpu-0-sized"].Sized || sh["gpu-0-sized"].Kind != share.KindMPS ||
		sh["gpu-1-sized"].Kind != share.KindShared || !sh["gpu-1-sized"].ShimOversub {
		t.Errorf("shares %+v: want the three sized devices, MPS and shim", sh)
	}
}

// A claim's consumed capacity becomes its container's limits: MPS pinned memory in whole MiB (rounded
// down, so never above the allocation), the context reserve left out of it so a process that fills it
// holds at most its claim by NVML, and thread percentage; the shim's memory limit in bytes, with no
// compute limit.
func TestSizedLimitsTurnConsumedCapacityIntoLimits(t *testing.T) {
	mpsDev := share.Device{Kind: share.KindMPS, GPUUUID: "GPU-a", Sized: true}
	shimDev := share.Device{Kind: share.KindShared, GPUUUID: "GPU-a", Sized: true}
	caps := func(memory, compute string) map[resourcev1.QualifiedName]resource.Quantity {
		m := map[resourcev1.QualifiedName]resource.Quantity{}
		if memory != "" {
			m[CapacityMemory] = resource.MustParse(memory)
		}
		if compute != "" {
			m[CapacityCompute] = resource.MustParse(compute)
		}
		return m
	}
	const reserve = 768 << 20
	for _, tt := range []struct {
		name     string
		dev      share.Device
		consumed map[resourcev1.QualifiedName]resource.Quantity
		reserve  int64
		want     string
		err      error
	}{
		{"MPS, 10Gi and 30 percent", mpsDev, caps("10Gi", "30"), 0, "mps 30% 10240MiB shim 10737418240", nil},
		{"MPS, 10Gi less the context reserve", mpsDev, caps("10Gi", "30"), reserve, "mps 30% 9472MiB shim 9932111872", nil},
		{"MPS, 8Gi less the context reserve", mpsDev, caps("8Gi", "25"), reserve, "mps 25% 7424MiB shim 7784628224", nil},
		{"MPS, the defaults a claim that asked nothing consumed", mpsDev, caps("13Gi", "33"), 0, "mps 33% 13312MiB shim 13958643712", nil},
		{"MPS, a memory amount off the MiB grid rounds down", mpsDev, caps("1536Ki", "1"), 0, "mps 1% 1MiB shim 1048576", nil},
		{"MPS, less than a MiB is still a limit", mpsDev, caps("512Ki", "1"), 0, "mps 1% 1MiB shim 1048576", nil},
		{"MPS, a fraction of a percent rounds up to a whole one", mpsDev, caps("1Gi", "500m"), 0, "mps 1% 1024MiB shim 1073741824", nil},
		{"MPS, a claim of the context reserve holds no process", mpsDev, caps("768Mi", "10"), reserve, "", ErrClaimBelowContextReserve},
		{"shim, bytes as consumed, compute not limited", shimDev, caps("4Gi", "50"), reserve, "shim 4294967296", nil},
		{"shim, a claim allocated without consumed capacity", shimDev, caps("", ""), 0, "", ErrNoConsumedCapacity},
		{"MPS, no compute consumed", mpsDev, caps("4Gi", ""), 0, "", ErrNoConsumedCapacity},
	} {
		d, err := SizedLimits(tt.dev, tt.consumed, tt.reserve)
		if !errors.Is(err, tt.err) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.err)
			continue
		}
		if err != nil {
			continue
		}
		got := fmt.Sprintf("shim %d", d.MemoryLimitBytes)
		if d.MPS != nil {
			got = fmt.Sprintf("mps %d%% %dMiB shim %d", d.MPS.ActiveThreadPercentage, d.MPS.PinnedMemoryLimitMiB, d.MemoryLimitBytes)
		}
		if got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

// The sized device offers what the agent read claims can use (status.gpus[].sized.memoryCapacity), not
// the GPU's memory, where the status carries it; its default share is cut from that.
func TestASizedDeviceOffersTheUsableMemory(t *testing.T) {
	g := sizedGPU(0, "40Gi", &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 4}}, "", "")
	usable := resource.MustParse("39Gi")
	g.Sized = &v1alpha1.GPUSizedClaims{MemoryCapacity: &usable}
	sh, ok := sizedShare(g, share.Config{})
	if !ok {
		t.Fatal("no sized device")
	}
	mem := sh.dev.Capacity[CapacityMemory]
	if mem.Value.Cmp(usable) != 0 || mem.RequestPolicy.Default.Value() != 9<<30 {
		t.Errorf("memory capacity %s (default %s), want 39Gi (default 9Gi: 39Gi over 4 on the 1Gi grid)", mem.Value.String(), mem.RequestPolicy.Default)
	}
}
