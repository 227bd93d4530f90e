package node

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// ClaimedMIG is the DRA kubelet plugin's side of a dynamic MIG GPU (*dra.DynamicMIG): the instances it
// created for claims, and the lock under which the layout applier changes a GPU around them.
type ClaimedMIG interface {
	Around(uuid string, f func(held []gpu.Placement) error) error
	Records() []dra.MIGRecord
}

// InstanceHealthSource is the health watcher's view of the claims' MIG instances it marked alone
// (*health.Watcher).
type InstanceHealthSource interface {
	Instances(gpuUUID string) map[int]health.Health
}

// checkDynamicMIG refuses allowed profiles the GPU does not offer (LayoutDoesNotFit), before anything
// changes.
func checkDynamicMIG(dev gpu.Device, s v1alpha1.MIGSharing) error {
	if s.Dynamic == nil {
		return nil
	}
	for _, p := range s.Dynamic.Profiles {
		if _, ok := dev.Profile(p); !ok {
			return outcome.Newf(v1alpha1.ReasonLayoutDoesNotFit, "GPU %d (%s): mig.dynamic profile %s is not offered by this GPU (it offers %s)",
				dev.Index, dev.Product, p, dev.ProfileNames())
		}
	}
	return nil
}

// around runs f with the placements claims hold on the GPU, under the plugin's lock; without a plugin
// no claim holds any.
func (s *Strategies) around(uuid string, f func(held []gpu.Placement) error) error {
	if s.ClaimedMIG == nil {
		return f(nil)
	}
	return s.ClaimedMIG.Around(uuid, f)
}

// appliedMIGDynamic is the dynamic MIG in force: the desired profiles once applied, the ones before while
// a change drains the GPU (the claims allocated keep their placements until it is empty).
func appliedMIGDynamic(st *v1alpha1.GPUStatus, desired *v1alpha1.GPUDesired, err error, prev *v1alpha1.GPUStatus) {
	if st.Applied == nil || st.Applied.Strategy != v1alpha1.StrategyMIG {
		return
	}
	switch {
	case desired != nil && err == nil:
		if m := desired.Sharing.MIG; m != nil && m.Dynamic != nil {
			st.Applied.MIGDynamic = &v1alpha1.DynamicMIGStatus{Profiles: append([]string(nil), m.Dynamic.Profiles...)}
		}
	case desired != nil && prev != nil && prev.Applied != nil && prev.Applied.MIGDynamic != nil:
		st.Applied.MIGDynamic = &v1alpha1.DynamicMIGStatus{Profiles: append([]string(nil), prev.Applied.MIGDynamic.Profiles...)}
	}
}

// setMIGClaims names, on each dynamic MIG GPU, the claim each instance was created for, and what is
// free: the memory slices no instance holds and the compute slices left.
func setMIGClaims(gpus []v1alpha1.GPUStatus, recs []dra.MIGRecord) {
	for i := range gpus {
		g := &gpus[i]
		a := g.Applied
		if a == nil || a.MIGDynamic == nil {
			continue
		}
		compute, slices := int32(0), int32(0)
		for _, p := range g.MIGProfiles {
			compute = max(compute, p.SliceCount)
			for _, pl := range p.Placements {
				slices = max(slices, pl.Start+pl.Size)
			}
		}
		sliceOf := map[string]int32{}
		for _, p := range g.MIGProfiles {
			sliceOf[p.Name] = p.SliceCount
		}
		taken := make([]bool, slices)
		markClaimed(a, g.UUID, recs)
		for _, in := range a.MIGInstances {
			compute -= sliceOf[in.Profile]
			for s := in.Placement.Start; s < in.Placement.Start+in.Placement.Size && s < slices; s++ {
				taken[s] = true
			}
		}
		a.MIGDynamic.FreeComputeSlices = max(compute, 0)
		a.MIGDynamic.FreeSlices = freeRanges(taken)
	}
}

// markClaimed names on a's instances the claims the ledger's records created them for.
func markClaimed(a *v1alpha1.AppliedSharing, gpuUUID string, recs []dra.MIGRecord) {
	for j := range a.MIGInstances {
		in := &a.MIGInstances[j]
		for _, r := range recs {
			if r.GPU == gpuUUID && r.Created && r.UUID == in.UUID {
				in.Claim = &v1alpha1.MIGClaimRef{Namespace: r.Namespace, Name: r.Name, UID: string(r.Claim), Pods: r.Pods}
			}
		}
	}
}

// markClaimed is markClaimed with the kubelet plugin's ledger, when the agent has one.
func (r *Reconciler) markClaimed(a *v1alpha1.AppliedSharing, gpuUUID string) {
	if r.MIGClaims != nil && a != nil {
		markClaimed(a, gpuUUID, r.MIGClaims.Records())
	}
}

// publishedMIGDynamic says whether the status last published has dynamic MIG in force on the GPU.
func publishedMIGDynamic(node *v1alpha1.GPUNode, uuid string) bool {
	if node == nil {
		return false
	}
	for _, g := range node.Status.GPUs {
		if g.UUID == uuid && g.Applied != nil {
			return g.Applied.MIGDynamic != nil
		}
	}
	return false
}

// freeRanges renders the free memory slices as "0-3,6", or "none".
func freeRanges(taken []bool) string {
	var parts []string
	for i := 0; i < len(taken); {
		if taken[i] {
			i++
			continue
		}
		j := i
		for j+1 < len(taken) && !taken[j+1] {
			j++
		}
		parts = append(parts, gpu.Placement{Start: i, Size: j - i + 1}.String())
		i = j + 1
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// dynamicToken renders a dynamic MIG GPU for the node summary: "MIG(dyn 3g.40gb,1g.10gb×2 free 7)".
func dynamicToken(a *v1alpha1.AppliedSharing) string {
	var ins []gpu.Instance
	for _, in := range a.MIGInstances {
		ins = append(ins, gpu.Instance{Profile: in.Profile})
	}
	return fmt.Sprintf("MIG(dyn %s free %s)", mig.Summary(ins), a.MIGDynamic.FreeSlices)
}

// migFreeSummary renders each dynamic GPU's free memory and compute slices for the wide table:
// "0:slices 4-7 compute 3".
func migFreeSummary(gpus []v1alpha1.GPUStatus) string {
	sorted := append([]v1alpha1.GPUStatus(nil), gpus...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var parts []string
	for _, g := range sorted {
		if g.Applied == nil || g.Applied.MIGDynamic == nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d:slices %s compute %d", g.Index, g.Applied.MIGDynamic.FreeSlices, g.Applied.MIGDynamic.FreeComputeSlices))
	}
	return strings.Join(parts, " ")
}

// layoutChange is what a change of a dynamic MIG GPU's fixed instances, and nothing else of its shape,
// takes from the GPU: dra.PlanLayoutChange over the instances in force (inForce names the claims'). ok
// is false for any other change, which drains the whole GPU, and for a layout that does not fit even on
// a GPU without claims (Admit refuses it). A change that takes nothing only creates fixed instances on
// free slices and is applied without a drain; one that takes claims' instances or fixed instances drains
// only their pods (layoutScope).
func layoutChange(dev gpu.Device, inForce *v1alpha1.AppliedSharing, from, to sharing.Shape, want v1alpha1.Sharing) (dra.LayoutChange, bool) {
	if !from.Dynamic || !to.Dynamic || from.Layout == to.Layout || want.MIG == nil || inForce == nil {
		return dra.LayoutChange{}, false
	}
	f, t := from, to
	f.Layout, t.Layout = "", ""
	if f != t || !dev.MIGMode.Current {
		return dra.LayoutChange{}, false
	}
	c, err := dra.PlanLayoutChange(dev.Profiles, inForce.MIGInstances, *want.MIG)
	return c, err == nil
}

// layoutFitsAroundClaims says whether a fixed-layout change of a dynamic MIG GPU leaves every pod in
// place (it takes nothing), so it is applied without a drain.
func layoutFitsAroundClaims(dev gpu.Device, inForce *v1alpha1.AppliedSharing, from, to sharing.Shape, want v1alpha1.Sharing) bool {
	c, ok := layoutChange(dev, inForce, from, to, want)
	return ok && c.Empty()
}

// layoutScope is the part of a dynamic MIG GPU a fixed-layout change drains: the pods of the claims and
// fixed instances it takes, and why each goes (the GPU's drain status shows it).
type layoutScope struct {
	reasons []string
	// migs are the MIG devices the change takes, whose device plugin pods go.
	migs []string
	// claims are the ResourceClaims whose pods go: the claims' instances it needs, and the claims of the
	// fixed instances it destroys (by published device name).
	claims vacate.ClaimScope
}

// scopeOf is the drain scope of a change that takes something; nil for one that takes nothing.
func scopeOf(index int, c dra.LayoutChange) *layoutScope {
	if c.Empty() {
		return nil
	}
	s := &layoutScope{reasons: c.Reasons()}
	for _, in := range c.Claims {
		s.migs = append(s.migs, in.UUID)
		if in.Claim != nil {
			s.claims.Claims = append(s.claims.Claims, types.UID(in.Claim.UID))
		}
	}
	for _, in := range c.Fixed {
		s.migs = append(s.migs, in.UUID)
		s.claims.Devices = append(s.claims.Devices, dra.MIGDeviceName(int32(index), in.UUID))
	}
	return s
}
