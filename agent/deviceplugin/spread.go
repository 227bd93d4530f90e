package deviceplugin

import (
	"slices"
	"sort"

	gpuinfo "github.com/gpusharing/gpusharing/agent/gpu"
)

// spreadGPUs picks n more GPUs out of candidates (in advertised order, those in held skipped) for a
// container that holds shares of the held GPUs already. The group it builds, held included, is the
// one whose farthest pair of GPUs is closest in topo (most NVLinks, then the closest PCIe ancestor,
// as `nvidia-smi topo -m` ranks paths); among equals the one whose GPUs have the fewest shares in use,
// then the earliest in advertised order. Collectives run at the pace of the slowest link, so the
// farthest pair is what is minimized. The picks are returned least used first, then in advertised
// order; fewer than n when fewer GPUs are left.
func spreadGPUs(candidates, held []string, n int, topo gpuinfo.Topology, inUse func(string) int) []string {
	sp := spread{topo: topo, inUse: inUse}
	for _, g := range candidates {
		if !slices.Contains(held, g) {
			sp.pool = append(sp.pool, g)
		}
	}
	n = min(n, len(sp.pool))
	if n <= 0 {
		return nil
	}
	var picks []string
	if len(held) > 0 {
		picks = sp.grow(slices.Clone(held), n)
	} else {
		var bestSpan gpuinfo.Link
		for _, seed := range sp.pool {
			added := append([]string{seed}, sp.grow([]string{seed}, n-1)...)
			s, _ := sp.span(added)
			if picks == nil || s.Closer(bestSpan) || (!bestSpan.Closer(s) && sp.used(added) < sp.used(picks)) {
				picks, bestSpan = added, s
			}
		}
	}
	pos := map[string]int{}
	for i, g := range sp.pool {
		pos[g] = i
	}
	sort.SliceStable(picks, func(i, j int) bool {
		if ui, uj := inUse(picks[i]), inUse(picks[j]); ui != uj {
			return ui < uj
		}
		return pos[picks[i]] < pos[picks[j]]
	})
	return picks
}

// spread is one spreadGPUs choice: the GPUs it may pick (pool), their links and their use.
type spread struct {
	topo  gpuinfo.Topology
	inUse func(string) int
	pool  []string
}

func (sp spread) link(a, b string) gpuinfo.Link {
	if l, ok := sp.topo.Between(a, b); ok {
		return l
	}
	// A pair NVML could not describe counts as the farthest: the choice falls back to use and order.
	return gpuinfo.Link{PCIe: gpuinfo.PCIeSystem}
}

// farthest is the slowest link between c and the group; ok is false for an empty group.
func (sp spread) farthest(c string, group []string) (worst gpuinfo.Link, ok bool) {
	for _, g := range group {
		if l := sp.link(c, g); !ok || worst.Closer(l) {
			worst, ok = l, true
		}
	}
	return worst, ok
}

// grow adds k GPUs of the pool to group, each the closest to the group so far, then the least used,
// and returns those it added.
func (sp spread) grow(group []string, k int) []string {
	var added []string
	for len(added) < k {
		best, bestLink := "", gpuinfo.Link{}
		for _, c := range sp.pool {
			if slices.Contains(group, c) {
				continue
			}
			l, _ := sp.farthest(c, group)
			switch {
			case best == "", l.Closer(bestLink):
			case bestLink.Closer(l), sp.inUse(c) >= sp.inUse(best):
				continue
			}
			best, bestLink = c, l
		}
		if best == "" {
			break
		}
		group = append(group, best)
		added = append(added, best)
	}
	return added
}

// span is the group's farthest pair; ok false for a single GPU.
func (sp spread) span(group []string) (worst gpuinfo.Link, ok bool) {
	for i, g := range group {
		if l, lok := sp.farthest(g, group[i+1:]); lok && (!ok || worst.Closer(l)) {
			worst, ok = l, true
		}
	}
	return worst, ok
}

// used is how many shares of the group's GPUs other containers hold.
func (sp spread) used(group []string) (u int) {
	for _, g := range group {
		u += sp.inUse(g)
	}
	return u
}
