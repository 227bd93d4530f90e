package dra

import (
	"fmt"
	"strings"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// LayoutChange is what a change of a dynamic MIG GPU's fixed instances takes from the GPU: the plan
// that places the new fixed instances, the claims' instances whose placements it needs, and the fixed
// instances it destroys. Only the pods of those go (the drain's scope); every other claim's pod keeps
// running on its instance, and the placements the plan creates on are withheld from the slices until
// the change is applied, so new claims land only where nothing changes.
type LayoutChange struct {
	Plan mig.Plan
	// Claims are the instances created for claims that the plan needs the slices of.
	Claims []v1alpha1.MIGInstanceStatus
	// Fixed are the fixed instances the plan destroys.
	Fixed []v1alpha1.MIGInstanceStatus
}

// Empty says the change takes nothing: it is applied under running work.
func (c LayoutChange) Empty() bool { return len(c.Claims) == 0 && len(c.Fixed) == 0 }

// Creates are the placements the plan creates fixed instances on.
func (c LayoutChange) Creates() []nvgpu.Placement {
	out := make([]nvgpu.Placement, 0, len(c.Plan.Create))
	for _, p := range c.Plan.Create {
		out = append(out, p.At)
	}
	return out
}

// Reasons says, per instance the change takes, why: "claim ns/name (2g.20gb at 0-1): the new fixed
// 3g.40gb at 0-3 needs its slices", "fixed 1g.10gb at 6 (MIG-…): not in the new layout".
func (c LayoutChange) Reasons() []string {
	var out []string
	for _, in := range c.Claims {
		pl := placementOf(in)
		var needs []string
		for _, p := range c.Plan.Create {
			if p.At.Overlaps(pl) {
				needs = append(needs, fmt.Sprintf("%s at %s", p.Profile.Name, p.At))
			}
		}
		name := in.UUID
		if in.Claim != nil {
			name = in.Claim.Namespace + "/" + in.Claim.Name
		}
		out = append(out, fmt.Sprintf("claim %s (%s at %s): the new fixed %s needs its slices", name, in.Profile, pl, strings.Join(needs, ", ")))
	}
	for _, in := range c.Fixed {
		out = append(out, fmt.Sprintf("fixed %s at %s (%s): not in the new layout", in.Profile, placementOf(in), in.UUID))
	}
	return out
}

// PlanLayoutChange plans a dynamic MIG GPU's new fixed instances (want) against the instances in force
// (instances, each created for a claim where Claim is set) on a GPU with these profiles: the plan that
// takes the fewest claims' instances (mig.MakePlanGivingUp). The agent drains what it returns; the
// slices withhold its creates meanwhile. An error means the layout does not fit even on a GPU without
// claims.
func PlanLayoutChange(profiles []nvgpu.Profile, instances []v1alpha1.MIGInstanceStatus, want v1alpha1.MIGSharing) (LayoutChange, error) {
	var fixed []nvgpu.Instance
	var held []nvgpu.Placement
	claimAt := map[nvgpu.Placement]v1alpha1.MIGInstanceStatus{}
	fixedByGI := map[int]v1alpha1.MIGInstanceStatus{}
	for _, in := range instances {
		pl := placementOf(in)
		if in.Claim != nil {
			held = append(held, pl)
			claimAt[pl] = in
			continue
		}
		fixed = append(fixed, nvgpu.Instance{Profile: in.Profile, Placement: pl, GIID: int(in.GPUInstanceID), CIID: int(in.ComputeInstanceID), UUID: in.UUID})
		fixedByGI[int(in.GPUInstanceID)] = in
	}
	plan, gone, err := mig.MakePlanGivingUp(profiles, fixed, mig.Wants(want), held)
	if err != nil {
		return LayoutChange{}, err
	}
	c := LayoutChange{Plan: plan}
	for _, pl := range gone {
		c.Claims = append(c.Claims, claimAt[pl])
	}
	for _, in := range plan.Destroy {
		c.Fixed = append(c.Fixed, fixedByGI[in.GIID])
	}
	return c, nil
}

// statusProfiles turns the profiles a GPU's status lists into the planner's.
func statusProfiles(g v1alpha1.GPUStatus) []nvgpu.Profile {
	out := make([]nvgpu.Profile, 0, len(g.MIGProfiles))
	for _, p := range g.MIGProfiles {
		np := nvgpu.Profile{ID: int(p.ID), Name: p.Name, SliceCount: int(p.SliceCount), MaxInstances: int(p.MaxInstances)}
		for _, pl := range p.Placements {
			np.Placements = append(np.Placements, nvgpu.Placement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		out = append(out, np)
	}
	return out
}

// pendingLayouts maps each dynamic MIG GPU of the node whose fixed-layout change drains only what it
// takes (a drain under way, dynamic in force and still wanted) to the placements the change creates on.
// The GPU keeps publishing its other placements; these are withheld until the change is applied.
func pendingLayouts(node *v1alpha1.GPUNode) map[string][]nvgpu.Placement {
	if node == nil {
		return nil
	}
	out := map[string][]nvgpu.Placement{}
	for _, g := range node.Status.GPUs {
		a := g.Applied
		if a == nil || a.MIGDynamic == nil || g.Drain == nil || g.Drain.Phase != v1alpha1.DrainPhaseDraining {
			continue
		}
		for _, d := range node.Spec.GPUs {
			if d.UUID != g.UUID || !LayoutOnlyChange(a, d.Sharing) {
				continue
			}
			if c, err := PlanLayoutChange(statusProfiles(g), a.MIGInstances, *d.Sharing.MIG); err == nil {
				out[g.UUID] = c.Creates()
			}
		}
	}
	return out
}

// LayoutOnlyChange says whether moving a GPU from the sharing in force to want changes only the fixed
// instances of a dynamic MIG GPU that stays dynamic: the change that drains only what it takes.
func LayoutOnlyChange(inForce *v1alpha1.AppliedSharing, want v1alpha1.Sharing) bool {
	from, ok := sharing.AppliedShape(inForce)
	to := sharing.ShapeOf(want)
	if !ok || !from.Dynamic || !to.Dynamic || want.MIG == nil {
		return false
	}
	from.Layout, to.Layout = "", ""
	return from == to
}

func placementOf(in v1alpha1.MIGInstanceStatus) nvgpu.Placement {
	return nvgpu.Placement{Start: int(in.Placement.Start), Size: int(in.Placement.Size)}
}
