// Package sharing holds the rule the controller and the agent share for what disturbs running work on a
// GPU: the controller rolls such changes out within a policy's budget, the agent drains the GPU first.
package sharing

import (
	"fmt"
	"sort"
	"strings"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Shape is the part of a GPU's sharing that running work depends on: the strategy, for MIG the layout,
// whether the shim's scheduler runs, and whether shares are sized per claim. Changing it means emptying
// the GPU; everything else (MPS percentages and limits, time-slice replicas and interval, the quantum,
// budget and mode of oversubscription, a sized GPU's memory step and minimum) is adjusted under running
// work.
type Shape struct {
	Strategy v1.Strategy
	// Layout is the MIG layout in canonical form ("1g.10gb x4,3g.40gb x1"), empty for other strategies.
	Layout string
	// Shim is whether oversubscription is on. Turning it on beside pods that run without the shim would
	// let them use memory the budget hands to others; turning it off leaves shim pods with no lock.
	Shim bool
	// Sized is whether shares are sized per claim. Pods hold fixed shares through the device plugin or
	// DRA devices that a sized GPU no longer publishes, and sized claims hold limits that fixed shares do
	// not know, so neither kind of holder may stay across the change.
	Sized bool
	// Dynamic is whether MIG instances come from claims (mig.dynamic). Turning it on or off changes what
	// the claims on the GPU hold; the profiles claims may ask for are not part of the shape: instances of
	// a profile no longer allowed stay with their claims until those end, so no pod must go for it.
	Dynamic bool
}

// ShapeOf is the shape a desired sharing asks for.
func ShapeOf(s v1.Sharing) Shape {
	sh := Shape{Strategy: s.Strategy, Shim: s.Oversubscription != nil, Sized: s.Sizing.PerClaim()}
	if s.Strategy == v1.StrategyMIG && s.MIG != nil {
		sh.Dynamic = s.MIG.Dynamic != nil
		counts := map[string]int32{}
		for _, in := range s.MIG.Instances {
			counts[in.Profile] += in.Count
		}
		sh.Layout = layout(counts)
	}
	return sh
}

// AppliedShape is the shape an agent reports in force; ok is false when the agent reports nothing yet.
func AppliedShape(a *v1.AppliedSharing) (Shape, bool) {
	if a == nil || a.Strategy == "" {
		return Shape{}, false
	}
	sh := Shape{Strategy: a.Strategy, Shim: a.Shim != nil, Sized: a.Sizing.PerClaim()}
	if a.Strategy == v1.StrategyMIG {
		sh.Dynamic = a.MIGDynamic != nil
		counts := map[string]int32{}
		for _, in := range a.MIGInstances {
			// An instance created for a claim is not the layout's.
			if in.Claim == nil {
				counts[in.Profile]++
			}
		}
		sh.Layout = layout(counts)
	}
	return sh, true
}

func layout(counts map[string]int32) string {
	parts := make([]string, 0, len(counts))
	for p, n := range counts {
		parts = append(parts, fmt.Sprintf("%s x%d", p, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Disruptive says whether moving a GPU from one shape to another disturbs the work running on it: a
// strategy change (for example MPS to time-slicing), a different MIG layout, oversubscription turned
// on or off, or sizing per claim turned on or off.
func Disruptive(from, to Shape) bool {
	return from != to
}
