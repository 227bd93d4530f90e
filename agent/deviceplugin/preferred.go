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
	byID := make(map[string]share.Device, len(all))
	order := make(map[string]int, len(all))
	total := map[string]int{}
	for i, d := range all {
		byID[d.ID] = d
		order[d.ID] = i
		total[d.GPUUUID]++
	}
	picked := []string{}
	chosen := map[string]bool{}
	pickedOn := map[string]int{}
	take := func(id string) {
		if chosen[id] || len(picked) >= size {
			return
		}
		chosen[id] = true
		picked = append(picked, id)
		pickedOn[byID[id].GPUUUID]++
	}
	for _, id := range mustInclude {
		take(id)
	}
	free := map[string][]string{} // GPU -> available device IDs in advertised order, not yet picked
	var unknown []string
	avail := append([]string(nil), available...)
	sort.SliceStable(avail, func(i, j int) bool { return order[avail[i]] < order[avail[j]] })
	for _, id := range avail {
		if chosen[id] {
			continue
		}
		d, ok := byID[id]
		if !ok {
			unknown = append(unknown, id)
			continue
		}
		free[d.GPUUUID] = append(free[d.GPUUUID], id)
	}
	inUse := func(gpu string) int { return total[gpu] - len(free[gpu]) - pickedOn[gpu] }
	kind := kindOf(all, mustInclude, avail, byID)
	gpus := make([]string, 0, len(free))
	for g := range free {
		gpus = append(gpus, g)
	}
	sort.Slice(gpus, func(i, j int) bool { return order[free[gpus[i]][0]] < order[free[gpus[j]][0]] })

	switch kind {
	case share.KindTimeSlicing, share.KindShared:
		var held []string // GPUs of the must-include shares, in their order
		for _, id := range picked {
			if g := byID[id].GPUUUID; !slices.Contains(held, g) {
				held = append(held, g)
			}
		}
		for _, g := range spreadGPUs(gpus, held, size-len(picked), topo, inUse) {
			take(free[g][0])
			free[g] = free[g][1:]
		}
		// Fewer GPUs than shares: double up on the least used, as evenly as the free shares allow.
		for len(picked) < size {
			best := ""
			for _, g := range gpus {
				if len(free[g]) == 0 {
					continue
				}
				if best == "" || pickedOn[g] < pickedOn[best] || (pickedOn[g] == pickedOn[best] && inUse(g) < inUse(best)) {
					best = g
				}
			}
			if best == "" {
				break
			}
			take(free[best][0])
			free[best] = free[best][1:]
		}
	case share.KindMPS:
		// Stay on the GPU of a must-include share; else the least used GPU that fits the rest.
		need := size - len(picked)
		target := ""
		for _, id := range mustInclude {
			if d, ok := byID[id]; ok {
				target = d.GPUUUID
				break
			}
		}
		if target == "" {
			for _, g := range gpus {
				if len(free[g]) >= need && (target == "" || inUse(g) < inUse(target)) {
					target = g
				}
			}
		}
		if target != "" {
			for _, id := range free[target] {
				take(id)
			}
		}
		// Nothing fits on one GPU: fill from the fullest-free GPUs; Allocate will say why it cannot serve it.
		sort.SliceStable(gpus, func(i, j int) bool { return len(free[gpus[i]]) > len(free[gpus[j]]) })
		for _, g := range gpus {
			for _, id := range free[g] {
				take(id)
			}
		}
	default:
		for _, id := range avail {
			take(id)
		}
	}
	for _, id := range unknown {
		take(id)
	}
	return picked
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
