package accounting

import (
	"cmp"
	"slices"
)

// Top returns at most n containers, those that hold the most memory first (then the busiest, then by
// name, so the choice is stable between reads); the metrics and the status bound their lists with it.
func Top(cs []Container, n int) []Container {
	if len(cs) <= n {
		return cs
	}
	sorted := slices.Clone(cs)
	slices.SortStableFunc(sorted, func(a, b Container) int {
		if c := cmp.Compare(b.MemoryBytes, a.MemoryBytes); c != 0 {
			return c
		}
		if c := cmp.Compare(b.SMPercent, a.SMPercent); c != 0 {
			return c
		}
		return cmp.Compare(a.Namespace+"/"+a.Name+"/"+a.Container, b.Namespace+"/"+b.Name+"/"+b.Container)
	})
	return sorted[:n]
}
