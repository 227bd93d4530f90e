// Package sharetest builds GPUNode statuses for tests of what a node's applied sharing offers: one GPU
// with options for each applied mode, health and sizing.
package sharetest

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// GPUOption shapes one GPU's status in a test.
type GPUOption func(*v1alpha1.GPUStatus)

// GPU is one GPU of that index and uuid, shaped by opts.
func GPU(index int32, uuid string, opts ...GPUOption) v1alpha1.GPUStatus {
	g := v1alpha1.GPUStatus{UUID: uuid, Index: index}
	for _, o := range opts {
		o(&g)
	}
	return g
}

// NodeStatus is a node status with these GPUs.
func NodeStatus(gpus ...v1alpha1.GPUStatus) v1alpha1.GPUNodeStatus {
	return v1alpha1.GPUNodeStatus{GPUs: gpus}
}

// Applied is g's applied sharing, made empty if it has none.
func Applied(g *v1alpha1.GPUStatus) *v1alpha1.AppliedSharing {
	if g.Applied == nil {
		g.Applied = &v1alpha1.AppliedSharing{}
	}
	return g.Applied
}

// Exclusive applies the Exclusive strategy.
func Exclusive() GPUOption {
	return func(g *v1alpha1.GPUStatus) { Applied(g).Strategy = v1alpha1.StrategyExclusive }
}

// TimeSliced applies time-slicing with that many replicas.
func TimeSliced(replicas int32) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		a := Applied(g)
		a.Strategy = v1alpha1.StrategyTimeSlicing
		a.TimeSlicing = &v1alpha1.TimeSlicingSharing{Replicas: replicas, Interval: v1alpha1.TimeSliceShort}
	}
}

// MPS applies MPS with its daemon in that state; atp 0 and pinned "" leave the limits unset.
func MPS(replicas, atp int32, pinned string, state v1alpha1.MPSDaemonState) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		a := Applied(g)
		a.Strategy = v1alpha1.StrategyMPS
		a.MPS = &v1alpha1.MPSStatus{State: state, Replicas: replicas, ActiveThreadPercentage: atp}
		if pinned != "" {
			q := resource.MustParse(pinned)
			a.MPS.PinnedMemoryLimit = &q
		}
	}
}

// MIGInstance adds one instance; an empty uuid is an instance not yet created.
func MIGInstance(profile, uuid string) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		a := Applied(g)
		a.Strategy = v1alpha1.StrategyMIG
		a.MIGInstances = append(a.MIGInstances, v1alpha1.MIGInstanceStatus{Profile: profile, UUID: uuid})
		g.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled", Pending: "Enabled"}
	}
}

// MIGModeOn reports MIG mode on with no instances applied.
func MIGModeOn() GPUOption {
	return func(g *v1alpha1.GPUStatus) { g.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled"} }
}

// Shim runs the shim's scheduler on the GPU with that time quantum (Exclusive unless a strategy is set).
func Shim(quantum time.Duration) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		a := Applied(g)
		if a.Strategy == "" {
			a.Strategy = v1alpha1.StrategyExclusive
		}
		a.Shim = &v1alpha1.ShimStatus{TimeQuantum: &metav1.Duration{Duration: quantum}}
	}
}

// ShimBudget is a shim scheduler that grants a memory budget (oversubscription).
func ShimBudget(quantum time.Duration, budget string) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		Shim(quantum)(g)
		q := resource.MustParse(budget)
		Applied(g).Shim.MemoryBudget = &q
	}
}

// Health adds a Healthy condition of that status.
func Health(s metav1.ConditionStatus) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		g.Conditions = append(g.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: s, Reason: "Test"})
	}
}

// SizedPerClaim marks the GPU's shares sized per claim, as the agent reports once that is in force.
func SizedPerClaim() GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		Applied(g).Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}
	}
}

// QoS gives the GPU production classes in force.
func QoS(productionPriority int32) GPUOption {
	return func(g *v1alpha1.GPUStatus) { Applied(g).QoS = &v1alpha1.QoS{ProductionPriority: productionPriority} }
}

// Minor reports the GPU's device node minor number (/dev/nvidia<minor>).
func Minor(minor int32) GPUOption {
	return func(g *v1alpha1.GPUStatus) { g.MinorNumber = &minor }
}

// MIGInstanceIDs adds one instance with its NVML GPU and compute instance ids, which name its
// capability device nodes.
func MIGInstanceIDs(profile, uuid string, gi, ci int32) GPUOption {
	return func(g *v1alpha1.GPUStatus) {
		MIGInstance(profile, uuid)(g)
		a := Applied(g)
		a.MIGInstances[len(a.MIGInstances)-1].GPUInstanceID = gi
		a.MIGInstances[len(a.MIGInstances)-1].ComputeInstanceID = ci
	}
}
