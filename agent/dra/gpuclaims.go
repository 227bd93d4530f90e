package dra

import (
	"cmp"
	"slices"
)

// GPUClaim is a claim the plugin prepared with a device of one GPU.
type GPUClaim struct {
	Namespace, Name string
	// Pods are the names, in Namespace, of the pods the claim was reserved for when it was prepared.
	Pods []string
}

// ClaimsOnGPU lists every claim the checkpoint holds with a device of the GPU uuid (the whole GPU, a
// share, a sized share or a MIG instance of it), whatever its kind, ordered by namespace and name. A GPU
// the plugin has not seen in a status yet has none. The shim scheduler's socket admits their pods' processes.
func (p *KubeletPlugin) ClaimsOnGPU(uuid string) []GPUClaim {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []GPUClaim
	for _, c := range p.cp.Claims {
		if slices.ContainsFunc(c.Devices, func(d preparedDevice) bool { return p.onGPULocked(d, uuid) }) {
			out = append(out, GPUClaim{Namespace: c.Namespace, Name: c.Name, Pods: slices.Clone(c.Pods)})
		}
	}
	slices.SortFunc(out, func(a, b GPUClaim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// onGPULocked says whether d is a device of GPU uuid: by the uuid a sized device records, else by the
// index its name starts with. p.mu held.
func (p *KubeletPlugin) onGPULocked(d preparedDevice, uuid string) bool {
	if d.GPU != "" {
		return d.GPU == uuid
	}
	index, ok := GPUIndex(d.Device)
	return ok && p.gpus[index] == uuid
}
