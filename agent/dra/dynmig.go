package dra

import (
	"fmt"
	"sort"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A GPU whose MIG instances come from claims (applied.migDynamic) is published as partitionable devices
// (KEP-4815, resource.k8s.io/v1 sharedCounters and consumesCounters): a counter set per GPU with one
// counter per memory slice, its compute slices, and each profile's instance limit where NVML gives one
// below its placement count; and one device per possible placement of each allowed profile, as NVML
// reports the placements, consuming the memory slices it covers, its compute slices and one of its
// profile's instances. The kube-scheduler allocates a placement only while every counter it consumes is
// free, so two claims never get overlapping placements, and the kubelet plugin creates the instance
// at the allocated placement when it prepares the claim (dynmigprepare.go).
const (
	// ShareMIGDynamic is the share attribute of a placement device (DeviceClass gpusharing-mig-dynamic).
	ShareMIGDynamic = "MIGDynamic"
	// AttrMIGPlacementStart and AttrMIGPlacementSize are a placement device's first memory slice and
	// its number of memory slices.
	AttrMIGPlacementStart = "migPlacementStart"
	AttrMIGPlacementSize  = "migPlacementSize"
	// TaintUnhealthy is the key of the taint on the placement device of an unhealthy instance.
	TaintUnhealthy = DriverName + "/unhealthy"
	// counterCompute counts a dynamic GPU's compute slices.
	counterCompute = "compute"
)

// dynPlacement is what the kubelet plugin needs to create the instance of a placement device.
type dynPlacement struct {
	GPUUUID   string
	GPUIndex  int32
	Profile   string
	ProfileID int32
	Placement nvgpu.Placement
}

// counterSetName names a dynamic GPU's counter set.
func counterSetName(index int32) string { return fmt.Sprintf("gpu-%d-mig", index) }

func memorySliceCounter(i int) string { return fmt.Sprintf("memory-slice-%d", i) }

func profileCounter(id int32) string { return fmt.Sprintf("profile-%d", id) }

// dynamicMIGPublished says whether the GPU publishes placement devices now: dynamic MIG in force with
// MIG mode on, healthy and not drained, or drained only of what a fixed-layout change takes (partial).
func dynamicMIGPublished(g v1alpha1.GPUStatus, partial bool) bool {
	a := g.Applied
	return a != nil && a.Strategy == v1alpha1.StrategyMIG && a.MIGDynamic != nil && len(a.MIGDynamic.Profiles) > 0 &&
		!meta.IsStatusConditionPresentAndEqual(g.Conditions, v1alpha1.ConditionHealthy, metav1.ConditionFalse) &&
		(g.Drain == nil || g.Drain.Phase != v1alpha1.DrainPhaseDraining || partial)
}

// dynamicMIG returns a dynamic GPU's counter set and its placement devices (with what preparing each
// needs), or nothing when the GPU publishes none. A placement that overlaps an instance not created for a
// claim (a fixed instance of the policy, or one made behind the agent's back) is left out: its slices are
// not free, whatever the counters say. So is one that overlaps a placement a pending fixed-layout change
// creates on (pending, keyed by GPU uuid; see pendingLayouts): the GPU is drained of what the change
// takes, and a claim allocated there now would be taken too.
func dynamicMIG(g v1alpha1.GPUStatus, pending map[string][]nvgpu.Placement) (*resourcev1.CounterSet, []offer, map[string]dynPlacement) {
	withheld, partial := pending[g.UUID]
	if !dynamicMIGPublished(g, partial) {
		return nil, nil, nil
	}
	allowed := map[string]bool{}
	for _, p := range g.Applied.MIGDynamic.Profiles {
		allowed[p] = true
	}
	var blocked []nvgpu.Placement
	unhealthy := map[nvgpu.Placement]string{}
	for _, in := range g.Applied.MIGInstances {
		pl := nvgpu.Placement{Start: int(in.Placement.Start), Size: int(in.Placement.Size)}
		switch {
		case in.Claim == nil:
			blocked = append(blocked, pl)
		case in.Unhealthy != "":
			unhealthy[pl] = in.Unhealthy
		}
	}
	counters := gpuCounters(g)
	set := counterSetName(g.Index)
	var out []offer
	places := map[string]dynPlacement{}
	for _, p := range g.MIGProfiles {
		if !allowed[p.Name] {
			continue
		}
		limited := p.MaxInstances > 0 && int(p.MaxInstances) < len(p.Placements)
		if limited {
			counters[profileCounter(p.ID)] = resourcev1.Counter{Value: *resource.NewQuantity(int64(p.MaxInstances), resource.DecimalSI)}
		}
		for _, mp := range p.Placements {
			pl := nvgpu.Placement{Start: int(mp.Start), Size: int(mp.Size)}
			if overlapsAny(pl, blocked) || overlapsAny(pl, withheld) {
				continue
			}
			dev := placementDevice(g, p, pl, set, limited)
			name := dev.Name
			if msg, ok := unhealthy[pl]; ok {
				// Its claim keeps the allocation and its pod keeps running; no claim gets the placement
				// again while the instance lives (the instance's destroy takes the taint away).
				dev.Taints = []resourcev1.DeviceTaint{unhealthyTaint(msg)}
			}
			out = append(out, offer{dev: dev, share: share.Device{
				ID: name, Kind: share.KindMIG, GPUUUID: g.UUID, GPUIndex: g.Index, GPUMinor: g.MinorNumber, MIGProfile: p.Name, Healthy: true,
			}})
			places[name] = dynPlacement{GPUUUID: g.UUID, GPUIndex: g.Index, Profile: p.Name, ProfileID: p.ID, Placement: pl}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dev.Name < out[j].dev.Name })
	return &resourcev1.CounterSet{Name: set, Counters: counters}, out, places
}

// gpuCounters is a dynamic GPU's counter set: one counter per memory slice and one for its compute
// slices, as many as its largest profile uses.
func gpuCounters(g v1alpha1.GPUStatus) map[string]resourcev1.Counter {
	counters := map[string]resourcev1.Counter{}
	one := *resource.NewQuantity(1, resource.DecimalSI)
	compute, memSlices := int32(0), 0
	for _, p := range g.MIGProfiles {
		compute = max(compute, p.SliceCount)
		for _, pl := range p.Placements {
			memSlices = max(memSlices, int(pl.Start+pl.Size))
		}
	}
	for i := 0; i < memSlices; i++ {
		counters[memorySliceCounter(i)] = resourcev1.Counter{Value: one}
	}
	counters[counterCompute] = resourcev1.Counter{Value: *resource.NewQuantity(int64(compute), resource.DecimalSI)}
	return counters
}

// placementDevice is the device for profile p at placement pl: it consumes the profile's compute
// slices, the memory slices pl covers and, where the profile has fewer instances than placements
// (limited), one of the profile's own counter.
func placementDevice(g v1alpha1.GPUStatus, p v1alpha1.MIGProfile, pl nvgpu.Placement, set string, limited bool) resourcev1.Device {
	one := *resource.NewQuantity(1, resource.DecimalSI)
	consumes := map[string]resourcev1.Counter{counterCompute: {Value: *resource.NewQuantity(int64(p.SliceCount), resource.DecimalSI)}}
	for i := pl.Start; i < pl.End(); i++ {
		consumes[memorySliceCounter(i)] = resourcev1.Counter{Value: one}
	}
	if limited {
		consumes[profileCounter(p.ID)] = resourcev1.Counter{Value: one}
	}
	dev := resourcev1.Device{
		Name: fmt.Sprintf("gpu-%d-mig-%s-%d", g.Index, dnsLabel(p.Name), pl.Start),
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			AttrParentUUID:        str(g.UUID),
			AttrIndex:             integer(int64(g.Index)),
			AttrProductName:       str(g.Product),
			AttrStrategy:          str(string(v1alpha1.StrategyMIG)),
			AttrShare:             str(ShareMIGDynamic),
			AttrReplicas:          integer(1),
			AttrOversubscribed:    boolean(false),
			AttrMIGProfile:        str(p.Name),
			AttrMIGPlacementStart: integer(int64(pl.Start)),
			AttrMIGPlacementSize:  integer(int64(pl.Size)),
		},
		ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: set, Counters: consumes}},
	}
	if p.Memory != nil {
		dev.Capacity = map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{CapacityMemory: {Value: *p.Memory}}
	}
	return dev
}

// unhealthyTaint marks the placement device of an instance a critical Xid hit. NoSchedule, not
// NoExecute: an Xid on one instance marks it alone, as the policy's drains decide which pods go; a
// NoExecute taint would have kube-controller-manager's device taint eviction delete the pod at once,
// whatever the Xid (many are the application's own fault and leave the instance usable). The value is
// the Xid ("Xid-79") where the message starts with one, empty otherwise (a label value; the GPUNode's
// status has the whole message).
func unhealthyTaint(msg string) resourcev1.DeviceTaint {
	value := ""
	if head, _, _ := strings.Cut(msg, ":"); strings.HasPrefix(head, "Xid ") {
		value = strings.ReplaceAll(head, " ", "-")
	}
	if len(validation.IsValidLabelValue(value)) > 0 {
		value = ""
	}
	return resourcev1.DeviceTaint{Key: TaintUnhealthy, Value: value, Effect: resourcev1.DeviceTaintEffectNoSchedule}
}

func overlapsAny(pl nvgpu.Placement, others []nvgpu.Placement) bool {
	for _, o := range others {
		if pl.Overlaps(o) {
			return true
		}
	}
	return false
}

// Counters lists the counter sets of the node's dynamic MIG GPUs, by GPU index.
func Counters(status v1alpha1.GPUNodeStatus) []resourcev1.CounterSet {
	return counters(status, nil)
}

func counters(status v1alpha1.GPUNodeStatus, pending map[string][]nvgpu.Placement) []resourcev1.CounterSet {
	var out []resourcev1.CounterSet
	for _, g := range status.GPUs {
		if set, _, _ := dynamicMIG(g, pending); set != nil {
			out = append(out, *set)
		}
	}
	return out
}

// dynamicPlacements maps every placement device the status publishes to its GPU, profile and placement.
func dynamicPlacements(status v1alpha1.GPUNodeStatus, pending map[string][]nvgpu.Placement) map[string]dynPlacement {
	out := map[string]dynPlacement{}
	for _, g := range status.GPUs {
		_, _, places := dynamicMIG(g, pending)
		for name, p := range places {
			out[name] = p
		}
	}
	return out
}
