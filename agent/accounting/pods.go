package accounting

import (
	"cmp"
	"slices"
)

// PodGPU is what one pod uses of one GPU: its containers there, summed.
type PodGPU struct {
	UUID        string
	Index       int
	MemoryBytes uint64
	// MemoryComplete is false when NVML could not read the memory of one of its processes there.
	MemoryComplete bool
	// SMPercent sums its containers' utilization on the GPU (at most 100); valid only when SMKnown.
	SMPercent float64
	SMKnown   bool
}

// Pod is one pod's use of the node's GPUs: every GPU any of its containers' processes uses, in GPU
// index order. A pod on several GPUs (a process per GPU, or one process using several) lists each.
type Pod struct {
	Namespace, Name string
	GPUs            []PodGPU
}

// Pods is the snapshot by pod rather than by GPU, ordered by namespace and name.
func (s Snapshot) Pods() []Pod {
	byKey := map[[2]string]*Pod{}
	for _, g := range s.GPUs {
		for _, c := range g.Containers {
			k := [2]string{c.Namespace, c.Name}
			p := byKey[k]
			if p == nil {
				p = &Pod{Namespace: c.Namespace, Name: c.Name}
				byKey[k] = p
			}
			i := slices.IndexFunc(p.GPUs, func(pg PodGPU) bool { return pg.UUID == g.UUID })
			if i < 0 {
				p.GPUs = append(p.GPUs, PodGPU{UUID: g.UUID, Index: g.Index, MemoryComplete: true, SMKnown: true})
				i = len(p.GPUs) - 1
			}
			pg := &p.GPUs[i]
			pg.MemoryBytes += c.MemoryBytes
			pg.MemoryComplete = pg.MemoryComplete && c.MemoryComplete
			pg.SMPercent = min(pg.SMPercent+c.SMPercent, 100)
			pg.SMKnown = pg.SMKnown && c.SMKnown
		}
	}
	out := make([]Pod, 0, len(byKey))
	for _, p := range byKey {
		slices.SortFunc(p.GPUs, func(a, b PodGPU) int { return cmp.Compare(a.Index, b.Index) })
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Pod) int { return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) })
	return out
}
