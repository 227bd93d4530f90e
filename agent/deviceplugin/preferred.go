package deviceplugin

import (
	"slices"
	"sort"

	gpuinfo "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/share"
)

// preferredAllocation picks size devices out of available, always keeping mustInclude. Replicas of
// time-sliced and shim-shared GPUs go to distinct GPUs: a container's N shares are N GPUs
// (docs/deviceplugin.md), chosen as the group whose farthest pair is closest in topo (NVLink, then
// PCIe), then the least used group, then advertised order; a GPU is picked twice only when fewer GPUs
// than shares have one free (k8s-device-plugin #491 is the opposite). MPS shares pack onto one GPU, the
// least used one that can hold the whole request, because an MPS client talks to one daemon, which
// serves one GPU, through that GPU's /dev/shm. Whole GPUs and MIG instances are taken in advertised
// order. all is the resource's full device list, so the number of replicas in use per GPU is known.
func preferredAllocation(all []share.Device, available, mustInclude []string, size int, topo gpuinfo.Topology) []string {
	p := newPicker(all, size)
	for _, id := range mustInclude {
		p.take(id)
	}
	avail := append([]string(nil), available...)
	sort.SliceStable(avail, func(i, j int) bool { return p.order[avail[i]] < p.order[avail[j]] })
	unknown := p.sortFree(avail)
	switch kindOf(all, mustInclude, avail, p.byID) {
	case share.KindTimeSlicing, share.KindShared:
		p.spread(topo)
	case share.KindMPS:
		p.pack(mustInclude)
	default:
		for _, id := range avail {
			p.take(id)
		}
	}
	for _, id := range unknown {
		p.take(id)
	}
	return p.picked
}

// picker holds one preferred-allocation answer as it is built.
type picker struct {
	size     int
	byID     map[string]share.Device
	order    map[string]int // device ID -> advertised position
	total    map[string]int // GPU -> devices advertised on it
	picked   []string
	chosen   map[string]bool
	pickedOn map[string]int      // GPU -> devices picked on it
	free     map[string][]string // GPU -> available device IDs in advertised order, not yet picked
	gpus     []string            // GPUs with a free device, in advertised order
}

func newPicker(all []share.Device, size int) *picker {
	p := &picker{
		size: size, byID: make(map[string]share.Device, len(all)), order: make(map[string]int, len(all)),
		total: map[string]int{}, picked: []string{}, chosen: map[string]bool{}, pickedOn: map[string]int{},
		free: map[string][]string{},
	}
	for i, d := range all {
		p.byID[d.ID] = d
		p.order[d.ID] = i
		p.total[d.GPUUUID]++
	}
	return p
}

func (p *picker) take(id string) {
	if p.chosen[id] || len(p.picked) >= p.size {
		return
	}
	p.chosen[id] = true
	p.picked = append(p.picked, id)
	p.pickedOn[p.byID[id].GPUUUID]++
}

// takeFrom picks the first free device of GPU g.
func (p *picker) takeFrom(g string) {
	p.take(p.free[g][0])
	p.free[g] = p.free[g][1:]
}

// inUse is how many of g's devices other containers hold.
func (p *picker) inUse(g string) int { return p.total[g] - len(p.free[g]) - p.pickedOn[g] }

// sortFree files the available devices not yet picked under their GPUs and returns those the resource
// does not list (the kubelet's word; they are picked last).
func (p *picker) sortFree(avail []string) (unknown []string) {
	for _, id := range avail {
		if p.chosen[id] {
			continue
		}
		d, ok := p.byID[id]
		if !ok {
			unknown = append(unknown, id)
			continue
		}
		p.free[d.GPUUUID] = append(p.free[d.GPUUUID], id)
	}
	for g := range p.free {
		p.gpus = append(p.gpus, g)
	}
	sort.Slice(p.gpus, func(i, j int) bool { return p.order[p.free[p.gpus[i]][0]] < p.order[p.free[p.gpus[j]][0]] })
	return unknown
}

// spread puts time-sliced and shim shares on distinct GPUs, the closest group in topo first.
func (p *picker) spread(topo gpuinfo.Topology) {
	var held []string // GPUs of the must-include shares, in their order
	for _, id := range p.picked {
		if g := p.byID[id].GPUUUID; !slices.Contains(held, g) {
			held = append(held, g)
		}
	}
	for _, g := range spreadGPUs(p.gpus, held, p.size-len(p.picked), topo, p.inUse) {
		p.takeFrom(g)
	}
	// Fewer GPUs than shares: double up on the least used, as evenly as the free shares allow.
	for len(p.picked) < p.size {
		best := ""
		for _, g := range p.gpus {
			if len(p.free[g]) == 0 {
				continue
			}
			if best == "" || p.pickedOn[g] < p.pickedOn[best] || (p.pickedOn[g] == p.pickedOn[best] && p.inUse(g) < p.inUse(best)) {
				best = g
			}
		}
		if best == "" {
			return
		}
		p.takeFrom(best)
	}
}

// pack puts MPS shares on one GPU: that of a must-include share, else the least used that fits them all.
func (p *picker) pack(mustInclude []string) {
	need := p.size - len(p.picked)
	target := ""
	for _, id := range mustInclude {
		if d, ok := p.byID[id]; ok {
			target = d.GPUUUID
			break
		}
	}
	if target == "" {
		for _, g := range p.gpus {
			if len(p.free[g]) >= need && (target == "" || p.inUse(g) < p.inUse(target)) {
				target = g
			}
		}
	}
	if target != "" {
		for _, id := range p.free[target] {
			p.take(id)
		}
	}
	// Nothing fits on one GPU: fill from the fullest-free GPUs; Allocate will say why it cannot serve it.
	gpus := slices.Clone(p.gpus)
	sort.SliceStable(gpus, func(i, j int) bool { return len(p.free[gpus[i]]) > len(p.free[gpus[j]]) })
	for _, g := range gpus {
		for _, id := range p.free[g] {
			p.take(id)
		}
	}
}

func kindOf(all []share.Device, mustInclude, available []string, byID map[string]share.Device) share.Kind {
	for _, ids := range [][]string{mustInclude, available} {
		for _, id := range ids {
			if d, ok := byID[id]; ok {
				return d.Kind
			}
		}
	}
	if len(all) > 0 {
		return all[0].Kind
	}
	return share.KindExclusive
}
