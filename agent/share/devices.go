package share

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/deviceid"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Kind is how a device is shared; it decides what ContainerEdits injects.
type Kind string

const (
	// KindExclusive is a whole GPU.
	KindExclusive Kind = "Exclusive"
	// KindTimeSlicing is one replica of a time-sliced GPU.
	KindTimeSlicing Kind = "TimeSlicing"
	// KindMPS is one MPS client share of a GPU.
	KindMPS Kind = "MPS"
	// KindMIG is one MIG instance.
	KindMIG Kind = "MIG"
	// KindShared is one share of a GPU scheduled by the shim's lock.
	KindShared Kind = "Shared"
)

// ReplicaSeparator joins a GPU's uuid and a replica number in a replica's device ID: GPU-1234::0.
const ReplicaSeparator = deviceid.Separator

// MPSLimits are the per-client MPS limits in force on a GPU.
type MPSLimits struct {
	// ActiveThreadPercentage is each client's share of the SMs, 1-100.
	ActiveThreadPercentage int32
	// PinnedMemoryLimitMiB is each client's device memory cap in MiB; 0 means none.
	PinnedMemoryLimitMiB int64
}

// Device is one advertised device and everything ContainerEdits needs to hand it out.
type Device struct {
	// ID is the device ID the kubelet sees: a GPU or MIG uuid, or <gpu-uuid>::<n> for a replica.
	ID string
	// Kind decides what ContainerEdits injects.
	Kind Kind
	// GPUUUID is the physical GPU (the parent, for a MIG instance); Cordon matches on it.
	GPUUUID string
	// GPUIndex is the GPU's NVML index, for a stable order.
	GPUIndex int32
	// VisibleUUID is what NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES name: the GPU's or MIG device's uuid.
	VisibleUUID string
	// GPUMinor is the minor number of the GPU's device node /dev/nvidia<GPUMinor> (the parent's, for a
	// MIG instance); nil where the status does not report it, and then no container gets the device.
	GPUMinor *int32
	// MIGGI and MIGCI are a MIG instance's GPU and compute instance ids, which name its capability
	// nodes (KindMIG only).
	MIGGI, MIGCI int32
	// Replica is the replica number of a shared GPU; 0 for whole GPUs and MIG instances.
	Replica int32
	// Healthy is false when the GPU's Healthy condition is False, or its MPS daemon is not running.
	Healthy bool
	// MIGProfile is the MIG instance's profile.
	MIGProfile string
	// MPS are the MPS client limits (KindMPS only).
	MPS *MPSLimits
	// ShimOversub says the GPU's shim scheduler grants a memory budget, so the shim swaps memory
	// (KindShared only).
	ShimOversub bool
	// QoS is the GPU's production classes (sharing.qos; KindMPS and KindShared). The DRA kubelet plugin,
	// which knows the pods of a claim, marks the MPS devices of an opportunistic pod (Opportunistic). The
	// device plugin cannot: the kubelet's Allocate does not say which pod a device goes to. Under the
	// shim neither needs to: the scheduler classifies each process by its pod.
	QoS *v1alpha1.QoS
	// Opportunistic marks an MPS device going to an opportunistic pod: its client runs at priority
	// "below normal" under the policy's opportunistic thread cap.
	Opportunistic bool
	// MPSNamespace, on an MPS device the DRA kubelet plugin prepares, is the claim's namespace: the
	// container connects to that namespace's daemon on the GPU (its own pipe directory and /dev/shm,
	// agent/mps) and to no other. Empty is the GPU's daemon: the device plugin's Allocate does not know
	// which pod, so which namespace, a device goes to.
	MPSNamespace string
	// Held marks a device of a cordoned GPU that is advertised only because a pod still holds it:
	// Allocate refuses it and GetPreferredAllocation leaves it out.
	Held bool
	// Sized marks the one DRA device of a GPU whose shares are sized per claim (KindMPS or KindShared):
	// the device plugin never advertises it, and the DRA kubelet plugin fills MPS and MemoryLimitBytes
	// from each claim's consumed capacity before ContainerEdits.
	Sized bool
	// MemoryLimitBytes is the shim's per-process memory limit (GPUSHARE_MEMORY_LIMIT_BYTES) of a sized
	// share: on a shim GPU the limit itself, on an MPS GPU what the shim reports as the GPU's memory
	// (the MPS server enforces the pinned limit); 0 sets none.
	MemoryLimitBytes int64
}

// ReplicaID is the device ID of replica n of a GPU.
func ReplicaID(gpuUUID string, n int32) string {
	return deviceid.Replica(gpuUUID, n).String()
}

// GPUOfDeviceID returns the uuid a device ID refers to: the GPU's for a replica, else the ID itself
// (a GPU or MIG uuid). The drain uses it to match the kubelet's PodResources to a GPU.
func GPUOfDeviceID(id string) string {
	return deviceid.Parse(id).UUID
}

// DevicesFromStatus computes what the node advertises from what the agent reports applied per GPU:
//   - no applied sharing, or Exclusive: the whole GPU under Resources.Exclusive (nothing if MIG mode is on);
//   - TimeSlicing: timeSlicing.replicas devices <uuid>::<n> under Resources.TimeSlicing;
//   - MPS: mps.replicas devices under Resources.MPS, Unhealthy unless the daemon is Running;
//   - MIG: one device per MIG instance that has a uuid, under MIGPrefix+profile;
//   - Exclusive or TimeSlicing with applied.shim: the replicas go under Resources.Shared instead, so a pod
//     gets the shim only when it asks for it (Exclusive uses cfg.ShimReplicas);
//   - a GPU whose applied.sizing is PerClaim: nothing. Its shares are sized by each claim, which only DRA
//     carries (the GPU's DevicePlugin condition says so); fixed replicas beside them would hand out
//     memory and SMs the claims' sizes already account for.
//
// A GPU whose Healthy condition is False has all its devices Unhealthy. Each resource's devices are
// sorted by GPU index, then replica, then ID.
func DevicesFromStatus(status v1alpha1.GPUNodeStatus, cfg Config) map[ResourceName][]Device {
	cfg = cfg.WithDefaults()
	out := map[ResourceName][]Device{}
	for _, g := range status.GPUs {
		if g.UUID == "" {
			continue
		}
		for res, devs := range gpuDevices(g, cfg) {
			out[res] = append(out[res], devs...)
		}
	}
	for res := range out {
		sortDevices(out[res])
	}
	return out
}

func gpuDevices(g v1alpha1.GPUStatus, cfg Config) map[ResourceName][]Device {
	healthy := !meta.IsStatusConditionPresentAndEqual(g.Conditions, v1alpha1.ConditionHealthy, metav1.ConditionFalse)
	base := Device{GPUUUID: g.UUID, GPUIndex: g.Index, GPUMinor: g.MinorNumber, VisibleUUID: g.UUID, Healthy: healthy}
	a := g.Applied
	if a != nil && a.Sizing.PerClaim() {
		return nil
	}
	strategy := v1alpha1.StrategyExclusive
	if a != nil && a.Strategy != "" {
		strategy = a.Strategy
	}
	switch strategy {
	case v1alpha1.StrategyExclusive:
		if g.MIGMode != nil && g.MIGMode.Current == "Enabled" {
			// A GPU in MIG mode cannot be handed out whole, and no instances are reported applied.
			return nil
		}
		if a != nil && a.Shim != nil {
			return map[ResourceName][]Device{cfg.Resources.Shared: shimReplicas(base, cfg.ShimReplicas, a)}
		}
		d := base
		d.ID, d.Kind = g.UUID, KindExclusive
		return map[ResourceName][]Device{cfg.Resources.Exclusive: {d}}
	case v1alpha1.StrategyTimeSlicing:
		n := int32(1)
		if a.TimeSlicing != nil && a.TimeSlicing.Replicas > 0 {
			n = a.TimeSlicing.Replicas
		}
		if a.Shim != nil {
			return map[ResourceName][]Device{cfg.Resources.Shared: shimReplicas(base, n, a)}
		}
		return map[ResourceName][]Device{cfg.Resources.TimeSlicing: replicas(base, KindTimeSlicing, n)}
	case v1alpha1.StrategyMPS:
		if a.MPS == nil || a.MPS.Replicas < 1 {
			// Without a reported daemon there is no pipe directory to hand out.
			return nil
		}
		if a.MPS.State != "" && a.MPS.State != v1alpha1.MPSDaemonRunning {
			base.Healthy = false
		}
		devs := replicas(base, KindMPS, a.MPS.Replicas)
		limits := mpsLimits(a.MPS)
		for i := range devs {
			devs[i].MPS = &limits
			devs[i].QoS = a.QoS
		}
		return map[ResourceName][]Device{cfg.Resources.MPS: devs}
	case v1alpha1.StrategyMIG:
		out := map[ResourceName][]Device{}
		for _, mi := range a.MIGInstances {
			// An instance created for a ResourceClaim is that claim's (DRA dynamic MIG), nobody else's.
			if mi.UUID == "" || mi.Claim != nil {
				continue
			}
			d := base
			d.ID, d.Kind, d.VisibleUUID, d.MIGProfile = mi.UUID, KindMIG, mi.UUID, mi.Profile
			d.MIGGI, d.MIGCI = mi.GPUInstanceID, mi.ComputeInstanceID
			res := cfg.MIGResource(mi.Profile)
			out[res] = append(out[res], d)
		}
		return out
	}
	return nil
}

func replicas(base Device, kind Kind, n int32) []Device {
	devs := make([]Device, 0, n)
	for i := int32(0); i < n; i++ {
		d := base
		d.ID, d.Kind, d.Replica = ReplicaID(base.GPUUUID, i), kind, i
		devs = append(devs, d)
	}
	return devs
}

func shimReplicas(base Device, n int32, a *v1alpha1.AppliedSharing) []Device {
	devs := replicas(base, KindShared, n)
	oversub := a.Shim.MemoryBudget != nil && a.Shim.MemoryBudget.Sign() > 0
	for i := range devs {
		devs[i].ShimOversub = oversub
		devs[i].QoS = a.QoS
	}
	return devs
}

func mpsLimits(s *v1alpha1.MPSStatus) MPSLimits {
	l := MPSLimits{ActiveThreadPercentage: s.ActiveThreadPercentage}
	if l.ActiveThreadPercentage <= 0 {
		// The API's default when activeThreadPercentage is omitted.
		l.ActiveThreadPercentage = max(1, 100/s.Replicas)
	}
	if s.PinnedMemoryLimit != nil {
		l.PinnedMemoryLimitMiB = s.PinnedMemoryLimit.Value() >> 20
	}
	return l
}

func sortDevices(devs []Device) {
	sort.Slice(devs, func(i, j int) bool {
		a, b := devs[i], devs[j]
		if a.GPUIndex != b.GPUIndex {
			return a.GPUIndex < b.GPUIndex
		}
		if a.Replica != b.Replica {
			return a.Replica < b.Replica
		}
		return a.ID < b.ID
	})
}

// String is for logs and test failures.
func (d Device) String() string {
	h := "Healthy"
	if !d.Healthy {
		h = "Unhealthy"
	}
	return fmt.Sprintf("%s(%s,%s)", d.ID, d.Kind, h)
}
