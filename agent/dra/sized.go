package dra

import (
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A GPU whose shares are sized per claim (applied.sizing PerClaim) is one device that many claims are
// allocated at once (DRA consumable capacity, KEP-5075): the kube-scheduler keeps the sum of the claims'
// memory and compute within the device's capacity, and records each claim's amounts in its allocation's
// consumedCapacity, which the kubelet plugin turns into limits (SizedLimits).
const (
	// ShareSized is the share attribute of a sized GPU's device (DeviceClass gpusharing-sized).
	ShareSized = "Sized"
	// AttrSizeEnforcement says what holds a sized claim to its size: EnforcementMPS (memory and compute)
	// or EnforcementShimMemory (memory only; compute is not capped on shim GPUs).
	AttrSizeEnforcement = "sizeEnforcement"
	// CapacityCompute is a sized GPU's SMs in percent: 100, claimed in steps of 1.
	CapacityCompute = "compute"

	EnforcementMPS        = "MPS"
	EnforcementShimMemory = "ShimMemory"

	// ComputeCapacity is the compute a sized GPU offers: percent of its SMs.
	ComputeCapacity = 100
)

// ErrNoConsumedCapacity: a claim holds a sized device without the amounts it consumes, which happens
// only when the scheduler that allocated it does not know consumable capacity (the DRAConsumableCapacity
// feature gate off): there is no size to enforce, and the whole GPU is not this claim's.
var ErrNoConsumedCapacity = errors.New("sized device allocated without consumedCapacity")

// ErrClaimBelowContextReserve: an MPS claim no larger than the context reserve, which a CUDA process holds
// before its first allocation; no process can run within such a claim.
var ErrClaimBelowContextReserve = errors.New("sized claim not larger than the CUDA context reserve")

// DefaultContextReserve is the device memory charged to each CUDA process of a sized claim for its
// context and driver allocations, which NVML counts and allocation limits do not; the shim schedulers'
// ledgers charge the same (docs/dra.md, "What a claim guarantees", has the measured contexts).
const DefaultContextReserve = scheduler.DefaultContextReserve

// sizedShare is the device of a GPU sized per claim, and the share its claims are
// prepared as; ok is false when the GPU offers no sized device now.
func sizedShare(g v1alpha1.GPUStatus, cfg share.Config) (offer, bool) {
	a := g.Applied
	if a == nil || !a.Sizing.PerClaim() || g.Memory == nil || g.Memory.Value() <= 0 {
		return offer{}, false
	}
	// Hidden while unhealthy or drained, as every other share.
	if meta.IsStatusConditionPresentAndEqual(g.Conditions, v1alpha1.ConditionHealthy, metav1.ConditionFalse) ||
		(g.Drain != nil && g.Drain.Phase == v1alpha1.DrainPhaseDraining) {
		return offer{}, false
	}
	base := share.Device{ID: g.UUID, GPUUUID: g.UUID, GPUIndex: g.Index, GPUMinor: g.MinorNumber, VisibleUUID: g.UUID, Healthy: true, Sized: true}
	var replicas int32
	var enforcement string
	switch {
	case a.Strategy == v1alpha1.StrategyMPS && a.MPS != nil && a.MPS.Replicas > 0:
		if a.MPS.State != "" && a.MPS.State != v1alpha1.MPSDaemonRunning {
			return offer{}, false
		}
		base.Kind, replicas, enforcement = share.KindMPS, a.MPS.Replicas, EnforcementMPS
		base.QoS = a.QoS
	case a.Shim != nil && a.Strategy == v1alpha1.StrategyTimeSlicing && a.TimeSlicing != nil:
		base.Kind, replicas, enforcement = share.KindShared, a.TimeSlicing.Replicas, EnforcementShimMemory
	case a.Shim != nil && a.Strategy == v1alpha1.StrategyExclusive:
		base.Kind, replicas, enforcement = share.KindShared, cfg.WithDefaults().ShimReplicas, EnforcementShimMemory
	default:
		// Nothing in force that could hold a claim to its size.
		return offer{}, false
	}
	if a.Shim != nil {
		base.ShimOversub = a.Shim.MemoryBudget != nil && a.Shim.MemoryBudget.Sign() > 0
		base.QoS = a.QoS
	}
	// What claims can really use (status.gpus[].sized.memoryCapacity: less the driver's reserve and the
	// MPS server), where the agent read it; the GPU's memory otherwise.
	memory := g.Memory.Value()
	if g.Sized != nil && g.Sized.MemoryCapacity != nil && g.Sized.MemoryCapacity.Sign() > 0 {
		memory = g.Sized.MemoryCapacity.Value()
	}
	step, minimum := a.Sizing.Step(), a.Sizing.Min()
	if minimum+step > memory {
		// The API server refuses a device whose minimum plus step exceeds its capacity, and with it the
		// whole slice; the agent refuses such sizes before applying them (SizingDoesNotFit).
		return offer{}, false
	}
	replicas = max(replicas, 1)
	dev := resourcev1.Device{
		Name: fmt.Sprintf("gpu-%d-sized", g.Index),
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			AttrUUID:            str(g.UUID),
			AttrIndex:           integer(int64(g.Index)),
			AttrProductName:     str(g.Product),
			AttrStrategy:        str(string(a.Strategy)),
			AttrShare:           str(ShareSized),
			AttrReplicas:        integer(int64(replicas)),
			AttrOversubscribed:  boolean(base.ShimOversub),
			AttrSizeEnforcement: str(enforcement),
		},
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			CapacityMemory: {
				Value: *resource.NewQuantity(memory, resource.BinarySI),
				RequestPolicy: &resourcev1.CapacityRequestPolicy{
					Default: resource.NewQuantity(defaultMemory(memory, minimum, step, replicas), resource.BinarySI),
					ValidRange: &resourcev1.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(minimum, resource.BinarySI),
						Step: resource.NewQuantity(step, resource.BinarySI),
					},
				},
			},
			CapacityCompute: {
				Value: *resource.NewQuantity(ComputeCapacity, resource.DecimalSI),
				RequestPolicy: &resourcev1.CapacityRequestPolicy{
					Default: resource.NewQuantity(defaultCompute(replicas), resource.DecimalSI),
					ValidRange: &resourcev1.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(1, resource.DecimalSI),
						Step: resource.NewQuantity(1, resource.DecimalSI),
					},
				},
			},
		},
	}
	return offer{dev: dev, share: base}, true
}

// defaultMemory is what a claim that asks for no memory gets: a fixed share's size, the GPU's memory over
// the policy's replicas, rounded down to the step grid above the minimum (never below the minimum).
func defaultMemory(memory, minimum, step int64, replicas int32) int64 {
	per := memory / int64(replicas)
	if per <= minimum {
		return minimum
	}
	return minimum + (per-minimum)/step*step
}

// defaultCompute is what a claim that asks for no compute gets: a fixed share's, 100/replicas percent
// (at least 1), as MPS gives each client when the policy sets no thread percentage.
func defaultCompute(replicas int32) int64 {
	return max(1, ComputeCapacity/int64(replicas))
}

// SizedLimits fills a sized device's limits from the amounts its claim consumes: on an MPS GPU the
// client's pinned memory limit and active thread percentage (1-100), and the shim's memory limit, which
// reports that limit as the GPU's memory; on a shim GPU the shim's memory limit in bytes. Compute is not
// enforced on shim GPUs: the lock gives the holder every SM for its quantum.
//
// A claim of M bytes is the device memory its pods' processes hold as NVML counts it, their CUDA
// contexts included, which the MPS server's pinned limit does not count: an MPS client's limit is M less
// reserve (the context reserve, PluginConfig.ContextReserve), in whole MiB rounded down, so a process that
// fills it holds at most M in NVML's figure. A claim no larger than the reserve cannot hold a process
// (ErrClaimBelowContextReserve). On shim GPUs the claim goes to the shim whole: the scheduler's ledger
// keeps the claim's allocations within M less a reserve per process.
func SizedLimits(d share.Device, consumed map[resourcev1.QualifiedName]resource.Quantity, reserve int64) (share.Device, error) {
	mem, ok := consumed[CapacityMemory]
	if !ok || mem.Sign() <= 0 {
		return d, ErrNoConsumedCapacity
	}
	switch d.Kind {
	case share.KindMPS:
		compute, ok := consumed[CapacityCompute]
		if !ok || compute.Sign() <= 0 {
			return d, ErrNoConsumedCapacity
		}
		reserve = max(0, reserve)
		if mem.Value() <= reserve {
			return d, fmt.Errorf("%w: claim %s, context reserve %s", ErrClaimBelowContextReserve,
				mem.String(), resource.NewQuantity(reserve, resource.BinarySI).String())
		}
		// Whole MiB rounded down, at least one: a zero limit would read as none.
		mib := max(1, (mem.Value()-reserve)>>20)
		// Value rounds a fraction up; the policy's step of 1 makes every amount whole anyway.
		atp := int32(min(ComputeCapacity, max(1, compute.Value())))
		d.MPS = &share.MPSLimits{ActiveThreadPercentage: atp, PinnedMemoryLimitMiB: mib}
		// The shim reports the client's limit as the GPU's memory (addMPS); MPS enforces it.
		d.MemoryLimitBytes = mib << 20
	case share.KindShared:
		d.MemoryLimitBytes = mem.Value()
	default:
		return d, fmt.Errorf("sized device of kind %s", d.Kind)
	}
	return d, nil
}
