package dra

import (
	"cmp"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// SizedClaim is what one prepared claim holds of one sized GPU: the sum of the consumedCapacity of its
// allocations of the GPU's device, and the pods it was reserved for when the kubelet prepared it.
type SizedClaim struct {
	UID       types.UID
	Namespace string
	Name      string
	// Pods are pod names in Namespace; empty for a claim prepared before the agent recorded them.
	Pods []string
	// GPU is the GPU's uuid.
	GPU            string
	MemoryBytes    int64
	ComputePercent int64
}

// SizedClaims lists the prepared claims' holdings of sized GPUs, ordered by GPU, namespace and name. It
// reads the checkpoint, so a claim is listed from its preparation to its unpreparation (or until the
// sweep of gone claims forgets it), across agent restarts.
func (p *KubeletPlugin) SizedClaims() []SizedClaim {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []SizedClaim
	for uid, pc := range p.cp.Claims {
		byGPU := map[string]int{}
		for _, d := range pc.Devices {
			if d.GPU == "" {
				continue
			}
			i, ok := byGPU[d.GPU]
			if !ok {
				i = len(out)
				byGPU[d.GPU] = i
				out = append(out, SizedClaim{UID: uid, Namespace: pc.Namespace, Name: pc.Name, Pods: slices.Clone(pc.Pods), GPU: d.GPU})
			}
			out[i].MemoryBytes += d.MemoryBytes
			out[i].ComputePercent += d.ComputePercent
		}
	}
	slices.SortFunc(out, func(a, b SizedClaim) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out
}

// sizedAmounts records a sized device's GPU and the amounts an allocation of it consumes.
func sizedAmounts(gpu string, consumed map[resourcev1.QualifiedName]resource.Quantity) preparedDevice {
	d := preparedDevice{GPU: gpu}
	if q, ok := consumed[CapacityMemory]; ok {
		d.MemoryBytes = q.Value()
	}
	if q, ok := consumed[CapacityCompute]; ok {
		d.ComputePercent = q.Value()
	}
	return d
}

// reservedPods are the names of the pods a claim is reserved for, sorted. The API server bounds
// reservedFor (256 entries), so the list is bounded too.
func reservedPods(c *resourcev1.ResourceClaim) []string {
	var out []string
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" && r.Name != "" {
			out = append(out, r.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
