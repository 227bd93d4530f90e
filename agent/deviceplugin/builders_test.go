package deviceplugin

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// gpuOption shapes one GPU's status in a test.
type gpuOption func(*v1alpha1.GPUStatus)

func gpu(index int32, uuid string, opts ...gpuOption) v1alpha1.GPUStatus {
	g := v1alpha1.GPUStatus{UUID: uuid, Index: index}
	for _, o := range opts {
		o(&g)
	}
	return g
}

func nodeStatus(gpus ...v1alpha1.GPUStatus) v1alpha1.GPUNodeStatus {
	return v1alpha1.GPUNodeStatus{GPUs: gpus}
}

func applied(g *v1alpha1.GPUStatus) *v1alpha1.AppliedSharing {
	if g.Applied == nil {
		g.Applied = &v1alpha1.AppliedSharing{}
	}
	return g.Applied
}

func exclusive() gpuOption {
	return func(g *v1alpha1.GPUStatus) { applied(g).Strategy = v1alpha1.StrategyExclusive }
}

func timeSliced(replicas int32) gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		a := applied(g)
		a.Strategy = v1alpha1.StrategyTimeSlicing
		a.TimeSlicing = &v1alpha1.TimeSlicingSharing{Replicas: replicas, Interval: v1alpha1.TimeSliceShort}
	}
}

func mps(replicas, atp int32, pinned string, state v1alpha1.MPSDaemonState) gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		a := applied(g)
		a.Strategy = v1alpha1.StrategyMPS
		a.MPS = &v1alpha1.MPSStatus{State: state, Replicas: replicas, ActiveThreadPercentage: atp}
		if pinned != "" {
			q := resource.MustParse(pinned)
			a.MPS.PinnedMemoryLimit = &q
		}
	}
}

// migInstance adds one instance; an empty uuid is an instance not yet created.
func migInstance(profile, uuid string) gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		a := applied(g)
		a.Strategy = v1alpha1.StrategyMIG
		a.MIGInstances = append(a.MIGInstances, v1alpha1.MIGInstanceStatus{Profile: profile, UUID: uuid})
		g.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled", Pending: "Enabled"}
	}
}

func migModeOn() gpuOption {
	return func(g *v1alpha1.GPUStatus) { g.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled"} }
}

func shim(quantum time.Duration) gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		a := applied(g)
		if a.Strategy == "" {
			a.Strategy = v1alpha1.StrategyExclusive
		}
		a.Shim = &v1alpha1.ShimStatus{TimeQuantum: &metav1.Duration{Duration: quantum}}
	}
}

// shimBudget is a shim scheduler that grants a memory budget (oversubscription).
func shimBudget(quantum time.Duration, budget string) gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		shim(quantum)(g)
		q := resource.MustParse(budget)
		applied(g).Shim.MemoryBudget = &q
	}
}

func health(s metav1.ConditionStatus) gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		g.Conditions = append(g.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: s, Reason: "Test"})
	}
}

// sizedPerClaim marks the GPU's shares sized per claim, as the agent reports once that is in force.
func sizedPerClaim() gpuOption {
	return func(g *v1alpha1.GPUStatus) {
		applied(g).Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}
	}
}

// qos gives the GPU production classes in force.
func qos(productionPriority int32) gpuOption {
	return func(g *v1alpha1.GPUStatus) { applied(g).QoS = &v1alpha1.QoS{ProductionPriority: productionPriority} }
}
