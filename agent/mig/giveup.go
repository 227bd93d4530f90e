package mig

import "github.com/gpusharing/gpusharing/agent/gpu"

// MakePlanGivingUp is MakePlanAround where held placements may be given up when the wanted layout does
// not fit around all of them: it returns the plan that gives up the fewest held placements (among
// equals, the first such set in held's order) and the placements it gives up. A dynamic MIG GPU's
// fixed-layout change drains only the claims whose placements the new layout needs: a claim's pod is
// running work, so keeping claims weighs more than keeping fixed instances, which the plan keeps as
// MakePlanAround does. When the layout does not fit even with every placement given up, the error is
// MakePlanAround's on a GPU with no held placement.
func MakePlanGivingUp(profiles []gpu.Profile, existing []gpu.Instance, want []Want, held []gpu.Placement) (Plan, []gpu.Placement, error) {
	var err error
	for k := 0; k <= len(held); k++ {
		for _, subset := range combinations(len(held), k) {
			given := map[int]bool{}
			for _, i := range subset {
				given[i] = true
			}
			var keep, gone []gpu.Placement
			for i, h := range held {
				if given[i] {
					gone = append(gone, h)
				} else {
					keep = append(keep, h)
				}
			}
			var plan Plan
			if plan, err = MakePlanAround(profiles, existing, want, keep); err == nil {
				return plan, gone, nil
			}
		}
	}
	return Plan{}, nil, err
}
