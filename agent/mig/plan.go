// Package mig plans and applies MIG layouts. The planner is pure: it places a requested mix of GPU
// instance profiles onto the memory slices NVML says each profile may occupy, keeping instances that
// already match, or explains which profile does not fit and what holds the slices it needs. The applier
// enables MIG mode and creates and destroys instances through gpu.Interface.
package mig

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// Want asks for Count instances of one profile.
type Want struct {
	Profile string
	Count   int
}

// Placed is an instance the plan creates.
type Placed struct {
	Profile gpu.Profile
	At      gpu.Placement
}

// Plan turns the instances that exist into the requested layout.
type Plan struct {
	// Keep are existing instances that stay (those without a compute instance get one).
	Keep []gpu.Instance
	// Destroy are existing instances that go, destroyed before anything is created.
	Destroy []gpu.Instance
	// Create are new instances, in the order they are created.
	Create []Placed
}

// Changes reports whether applying the plan does anything at all.
func (p Plan) Changes() bool {
	if len(p.Destroy) > 0 || len(p.Create) > 0 {
		return true
	}
	for _, k := range p.Keep {
		if k.CIID == gpu.NoComputeInstance {
			return true
		}
	}
	return false
}

// NoFitError says why a layout cannot be placed on a GPU (reason LayoutDoesNotFit).
type NoFitError struct{ Message string }

func (e *NoFitError) Error() string { return e.Message }

// item is one instance to place.
type item struct{ profile gpu.Profile }

// MakePlan places want onto a GPU with the given profiles and existing instances. It searches every
// placement (a GPU holds at most 7 instances, so exact search is cheap), keeping as many existing
// instances of wanted profiles as a valid layout allows.
func MakePlan(profiles []gpu.Profile, existing []gpu.Instance, want []Want) (Plan, error) {
	return MakePlanAround(profiles, existing, want, nil)
}

// MakePlanAround is MakePlan on a GPU where held placements are taken by instances the plan must
// neither keep nor destroy (those created for claims on a dynamic MIG GPU): the wanted instances are
// placed around them.
func MakePlanAround(profiles []gpu.Profile, existing []gpu.Instance, want []Want, held []gpu.Placement) (Plan, error) {
	byName := map[string]gpu.Profile{}
	for _, p := range profiles {
		byName[p.Name] = p
	}
	capacity, slices := 0, 0
	for _, p := range profiles {
		capacity = max(capacity, p.SliceCount)
		for _, pl := range p.Placements {
			slices = max(slices, pl.End())
		}
	}

	var items []item
	need := 0
	for _, w := range want {
		p, ok := byName[w.Profile]
		if !ok {
			return Plan{}, &NoFitError{Message: fmt.Sprintf("profile %s is not offered by this GPU (it offers %s)", w.Profile, names(profiles))}
		}
		if w.Count > p.MaxInstances {
			return Plan{}, &NoFitError{Message: fmt.Sprintf("%s x%d: this GPU holds at most %d instances of %s", w.Profile, w.Count, p.MaxInstances, w.Profile)}
		}
		for i := 0; i < w.Count; i++ {
			items = append(items, item{profile: p})
		}
		need += p.SliceCount * w.Count
	}
	if need > capacity {
		return Plan{}, &NoFitError{Message: fmt.Sprintf("the layout needs %d compute slices (%s); this GPU has %d", need, describe(want), capacity)}
	}
	// Largest first: big instances have the fewest placements, so the search fails fast.
	sort.SliceStable(items, func(i, j int) bool { return larger(items[i].profile, items[j].profile) })

	// Existing instances of wanted profiles may stay, at most Count of each.
	wanted := map[string]int{}
	for _, w := range want {
		wanted[w.Profile] = w.Count
	}
	var keepable, destroy []gpu.Instance
	for _, in := range sortedInstances(existing) {
		if wanted[in.Profile] > 0 {
			wanted[in.Profile]--
			keepable = append(keepable, in)
		} else {
			destroy = append(destroy, in)
		}
	}

	s := &search{items: items, slices: slices}
	for _, h := range held {
		s.held = append(s.held, occupant{profile: "a claim's instance", at: h})
	}
	// Try to keep every keepable instance, then ever fewer: the first layout found keeps the most.
	for k := len(keepable); k >= 0; k-- {
		if k == 0 {
			// Explain a failure on an empty GPU: the layout itself does not fit, whatever exists now.
			s.failOcc = nil
		}
		for _, subset := range combinations(len(keepable), k) {
			var keep []gpu.Instance
			kept := map[int]bool{}
			for _, i := range subset {
				keep = append(keep, keepable[i])
				kept[i] = true
			}
			if placed, ok := s.place(keep); ok {
				plan := Plan{Keep: keep, Destroy: append([]gpu.Instance(nil), destroy...), Create: placed}
				for i, in := range keepable {
					if !kept[i] {
						plan.Destroy = append(plan.Destroy, in)
					}
				}
				return plan, nil
			}
		}
	}
	return Plan{}, &NoFitError{Message: s.explain(want)}
}

// search is an exact search over placements.
type search struct {
	items  []item
	slices int
	// held are placements no wanted instance may overlap.
	held []occupant
	// deepest failure seen: the item that could not be placed and what occupied the GPU then.
	failDepth int
	failItem  gpu.Profile
	failOcc   []occupant
}

type occupant struct {
	profile string
	at      gpu.Placement
}

// place finds placements for the items not covered by keep, around keep.
func (s *search) place(keep []gpu.Instance) ([]Placed, bool) {
	occ := append([]occupant(nil), s.held...)
	remaining := map[string]int{}
	for _, in := range keep {
		occ = append(occ, occupant{in.Profile, in.Placement})
		remaining[in.Profile]++
	}
	var todo []gpu.Profile
	for _, it := range s.items {
		if remaining[it.profile.Name] > 0 {
			remaining[it.profile.Name]--
			continue
		}
		todo = append(todo, it.profile)
	}
	var out []Placed
	if s.dfs(todo, 0, occ, -1, &out) {
		return out, true
	}
	return nil, false
}

func (s *search) dfs(todo []gpu.Profile, i int, occ []occupant, minStart int, out *[]Placed) bool {
	if i == len(todo) {
		return true
	}
	p := todo[i]
	// Instances of the same profile are interchangeable: place them in increasing start order only.
	from := -1
	if i > 0 && todo[i-1].Name == p.Name {
		from = minStart
	}
	for _, pl := range p.Placements {
		if pl.Start <= from || taken(occ, pl) {
			continue
		}
		*out = append(*out, Placed{Profile: p, At: pl})
		if s.dfs(todo, i+1, append(occ, occupant{p.Name, pl}), pl.Start, out) {
			return true
		}
		*out = (*out)[:len(*out)-1]
	}
	if depth := len(occ); s.failOcc == nil || depth > s.failDepth {
		s.failDepth, s.failItem = depth, p
		s.failOcc = append([]occupant(nil), occ...)
	}
	return false
}

func taken(occ []occupant, pl gpu.Placement) bool {
	for _, o := range occ {
		if o.at.Overlaps(pl) {
			return true
		}
	}
	return false
}

// explain names the profile that could not be placed at the deepest point of the search, the
// placements it needs, what held them, and which memory slices were free.
func (s *search) explain(want []Want) string {
	p := s.failItem
	count := 0
	for _, w := range want {
		if w.Profile == p.Name {
			count = w.Count
		}
	}
	starts := make([]string, 0, len(p.Placements))
	for _, pl := range p.Placements {
		starts = append(starts, fmt.Sprint(pl.Start))
	}
	occ := append([]occupant(nil), s.failOcc...)
	sort.Slice(occ, func(i, j int) bool { return occ[i].at.Start < occ[j].at.Start })
	var held []string
	for _, o := range occ {
		held = append(held, fmt.Sprintf("slices %s are taken by %s", o.at, o.profile))
	}
	msg := fmt.Sprintf("%s x%d needs placements at {%s}", p.Name, count, strings.Join(starts, ","))
	if len(held) > 0 {
		msg += "; " + strings.Join(held, ", ")
	}
	return msg + "; free memory slices: " + free(occ, s.slices)
}

func free(occ []occupant, slices int) string {
	var ranges []string
	start := -1
	for i := 0; i <= slices; i++ {
		isFree := i < slices && !taken(occ, gpu.Placement{Start: i, Size: 1})
		switch {
		case isFree && start < 0:
			start = i
		case !isFree && start >= 0:
			ranges = append(ranges, gpu.Placement{Start: start, Size: i - start}.String())
			start = -1
		}
	}
	if len(ranges) == 0 {
		return "none"
	}
	return strings.Join(ranges, ",")
}

func larger(a, b gpu.Profile) bool {
	if a.SliceCount != b.SliceCount {
		return a.SliceCount > b.SliceCount
	}
	if a.MemoryMB != b.MemoryMB {
		return a.MemoryMB > b.MemoryMB
	}
	return a.Name < b.Name
}

func sortedInstances(in []gpu.Instance) []gpu.Instance {
	out := append([]gpu.Instance(nil), in...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Placement.Start < out[j].Placement.Start })
	return out
}

// combinations lists the k-element subsets of 0..n-1 in lexicographic order.
func combinations(n, k int) [][]int {
	var out [][]int
	var rec func(start int, cur []int)
	rec = func(start int, cur []int) {
		if len(cur) == k {
			out = append(out, append([]int(nil), cur...))
			return
		}
		for i := start; i < n; i++ {
			rec(i+1, append(cur, i))
		}
	}
	rec(0, nil)
	return out
}

func names(profiles []gpu.Profile) string {
	var n []string
	for _, p := range profiles {
		n = append(n, p.Name)
	}
	if len(n) == 0 {
		return "no MIG profiles"
	}
	return strings.Join(n, ", ")
}

// describe renders a request as "3g.40gb x1 + 1g.10gb x4".
func describe(want []Want) string {
	var parts []string
	for _, w := range want {
		parts = append(parts, fmt.Sprintf("%s x%d", w.Profile, w.Count))
	}
	return strings.Join(parts, " + ")
}
