// Package dra publishes a node's applied GPU sharing as Dynamic Resource Allocation devices
// (resource.k8s.io/v1 ResourceSlices): a device per whole GPU, per MIG instance and per share of a
// time-sliced, MPS or shim-shared GPU, with attributes a claim can select on. The devices are derived
// from share.DevicesFromStatus, the same applied state the device plugin advertises, so the two
// interfaces cannot disagree about what a GPU offers.
package dra

import (
	"fmt"
	"sort"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// DriverName is the DRA driver gpusharing publishes under.
const DriverName = "gpu.gpusharing.io"

// Attribute names, in the driver's domain (a claim's CEL reads device.attributes["gpu.gpusharing.io"].<name>).
const (
	AttrUUID           = "uuid"        // string: the GPU's uuid, the MIG device's for an instance
	AttrParentUUID     = "parentUUID"  // string: the physical GPU of a MIG instance
	AttrIndex          = "index"       // int: the GPU's NVML index
	AttrProductName    = "productName" // string: as NVML names it, "NVIDIA H100 80GB HBM3"
	AttrStrategy       = "strategy"    // string: Exclusive, MIG, MPS or TimeSlicing, as the GPU applies it
	AttrShare          = "share"       // string: Exclusive, MIG, MPS, TimeSlicing, Shared (a shim share) or Sized
	AttrReplicas       = "replicas"    // int: shares the GPU is cut into (1 for a whole GPU or a MIG instance; a sized GPU's defaults are one of them)
	AttrMIGProfile     = "migProfile"  // string: the instance's profile, 3g.40gb
	AttrMPSThreads     = "mpsActiveThreadPercentage"
	AttrMPSMemoryMiB   = "mpsPinnedMemoryLimitMiB" // int: 0 when the policy sets none
	AttrOversubscribed = "oversubscription"        // bool: the shim swaps memory under a budget
	// CapacityMemory is a device's GPU memory where a share has a size: the whole GPU's, the MIG
	// profile's, the MPS pinned limit, a sized GPU's (consumed by each claim).
	CapacityMemory = "memory"
)

// Devices turns a node's status into DRA devices, sorted by name. Unhealthy GPUs and GPUs being drained
// (cordoned) publish nothing, as the device plugin stops advertising them.
func Devices(status v1alpha1.GPUNodeStatus, cfg share.Config) []resourcev1.Device {
	return devices(status, cfg, nil)
}

func devices(status v1alpha1.GPUNodeStatus, cfg share.Config, pending map[string][]nvgpu.Placement) []resourcev1.Device {
	shares := published(status, cfg, pending)
	out := make([]resourcev1.Device, 0, len(shares))
	for _, s := range shares {
		out = append(out, s.dev)
	}
	return out
}

// Shares maps each device Devices publishes to the share it is: the kubelet plugin
// prepares a claim's devices with the share's container edits (share.ContainerEdits).
func Shares(status v1alpha1.GPUNodeStatus, cfg share.Config) map[string]share.Device {
	return shares(status, cfg, nil)
}

func shares(status v1alpha1.GPUNodeStatus, cfg share.Config, pending map[string][]nvgpu.Placement) map[string]share.Device {
	out := map[string]share.Device{}
	for _, s := range published(status, cfg, pending) {
		out[s.dev.Name] = s.share
	}
	return out
}

// offer is one published device and the share it comes from.
type offer struct {
	dev   resourcev1.Device
	share share.Device
}

func published(status v1alpha1.GPUNodeStatus, cfg share.Config, pending map[string][]nvgpu.Placement) []offer {
	gpus := map[string]v1alpha1.GPUStatus{}
	for _, g := range status.GPUs {
		gpus[g.UUID] = g
	}
	all := share.DevicesFromStatus(status, cfg)
	// A share's replicas attribute is how many shares of its kind the device plugin cut its GPU into:
	// counted from the same list, so the rule lives in DevicesFromStatus alone.
	type gpuKind struct {
		gpu  string
		kind share.Kind
	}
	shares := map[gpuKind]int64{}
	for _, devs := range all {
		for _, d := range devs {
			shares[gpuKind{d.GPUUUID, d.Kind}]++
		}
	}
	var out []offer
	seen := map[string]bool{}
	for _, devs := range all {
		for _, d := range devs {
			g := gpus[d.GPUUUID]
			// A GPU is hidden while it is drained; a drain that failed or waits for its retry left the GPU
			// as it was, and the device plugin advertises it again, so DRA does too.
			if !d.Healthy || (g.Drain != nil && g.Drain.Phase == v1alpha1.DrainPhaseDraining) {
				continue
			}
			dev := device(d, g, shares[gpuKind{d.GPUUUID, d.Kind}])
			if seen[dev.Name] {
				// Two instances with one uuid on one GPU: odd hardware. A slice with a name twice is
				// refused whole, so the second is left out rather than every device of the node.
				continue
			}
			seen[dev.Name] = true
			out = append(out, offer{dev: dev, share: d})
		}
	}
	// GPUs sized per claim are not among the device plugin's devices: each is one device of its own.
	for _, g := range status.GPUs {
		if s, ok := sizedShare(g, cfg); ok && !seen[s.dev.Name] {
			seen[s.dev.Name] = true
			out = append(out, s)
		}
	}
	// GPUs whose MIG instances come from claims publish their possible placements (dynmig.go).
	for _, g := range status.GPUs {
		_, shares, _ := dynamicMIG(g, pending)
		for _, s := range shares {
			if !seen[s.dev.Name] {
				seen[s.dev.Name] = true
				out = append(out, s)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dev.Name < out[j].dev.Name })
	return out
}

// OfGPU says whether a published device name belongs to the GPU of that index (a MIG instance's too):
// the drain matches claims' allocation results with it, and a GPU being drained publishes no devices, so
// the name alone must tell.
func OfGPU(name string, index int32) bool {
	whole := fmt.Sprintf("gpu-%d", index)
	return name == whole || strings.HasPrefix(name, whole+"-")
}

// MIGDeviceName is the published name of a fixed MIG instance: under its GPU's index (the name says which
// GPU the instance is on, OfGPU), unique where MIG uuids repeat across GPUs (go-nvml's mock numbers every
// GPU's instances alike).
func MIGDeviceName(gpuIndex int32, migUUID string) string {
	return fmt.Sprintf("gpu-%d-mig-%s", gpuIndex, dnsLabel(strings.TrimPrefix(migUUID, "MIG-")))
}

func device(d share.Device, g v1alpha1.GPUStatus, replicas int64) resourcev1.Device {
	attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		AttrUUID:           str(d.VisibleUUID),
		AttrIndex:          integer(int64(d.GPUIndex)),
		AttrProductName:    str(g.Product),
		AttrStrategy:       str(string(strategyOf(g))),
		AttrShare:          str(string(d.Kind)),
		AttrReplicas:       integer(1),
		AttrOversubscribed: boolean(d.ShimOversub),
	}
	capacity := map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{}
	name := fmt.Sprintf("gpu-%d", d.GPUIndex)
	switch d.Kind {
	case share.KindExclusive:
		if g.Memory != nil {
			capacity[CapacityMemory] = resourcev1.DeviceCapacity{Value: *g.Memory}
		}
	case share.KindMIG:
		name = MIGDeviceName(d.GPUIndex, d.VisibleUUID)
		attrs[AttrParentUUID] = str(d.GPUUUID)
		attrs[AttrMIGProfile] = str(d.MIGProfile)
		for _, p := range g.MIGProfiles {
			if p.Name == d.MIGProfile && p.Memory != nil {
				capacity[CapacityMemory] = resourcev1.DeviceCapacity{Value: *p.Memory}
			}
		}
	default: // the replicas of a shared GPU
		name = fmt.Sprintf("gpu-%d-%s-%d", d.GPUIndex, strings.ToLower(string(d.Kind)), d.Replica)
		attrs[AttrReplicas] = integer(replicas)
		if d.MPS != nil {
			attrs[AttrMPSThreads] = integer(int64(d.MPS.ActiveThreadPercentage))
			attrs[AttrMPSMemoryMiB] = integer(d.MPS.PinnedMemoryLimitMiB)
			if d.MPS.PinnedMemoryLimitMiB > 0 {
				capacity[CapacityMemory] = resourcev1.DeviceCapacity{Value: *resource.NewQuantity(d.MPS.PinnedMemoryLimitMiB<<20, resource.BinarySI)}
			}
		}
	}
	dev := resourcev1.Device{Name: name, Attributes: attrs}
	if len(capacity) > 0 {
		dev.Capacity = capacity
	}
	return dev
}

func strategyOf(g v1alpha1.GPUStatus) v1alpha1.Strategy {
	if g.Applied == nil || g.Applied.Strategy == "" {
		return v1alpha1.StrategyExclusive
	}
	return g.Applied.Strategy
}

// dnsLabel lowercases a uuid into a device name (a DNS label): letters, digits and dashes only.
func dnsLabel(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

func str(s string) resourcev1.DeviceAttribute    { return resourcev1.DeviceAttribute{StringValue: &s} }
func integer(v int64) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{IntValue: &v} }
func boolean(v bool) resourcev1.DeviceAttribute  { return resourcev1.DeviceAttribute{BoolValue: &v} }
