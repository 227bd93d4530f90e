package dra

import (
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// SizedClaim is what one claim holds of one sized GPU: the sum of the consumedCapacity of its allocations
// of the GPU's device, and the pods it is reserved for.
type SizedClaim struct {
	UID       types.UID
	Namespace string
	Name      string
	// Pods are pod names in Namespace: those it was reserved for when prepared, and when last read.
	Pods []string
	// PodUIDs are the UIDs of the same pods, from the same records; a claim prepared before they were
	// recorded has none until the API server is read (the names need it to be matched to a process, the
	// UIDs do not: a process's cgroup names its pod's UID).
	PodUIDs []types.UID
	// GPU is the GPU's uuid.
	GPU            string
	MemoryBytes    int64
	ComputePercent int64
}

// SizedClaims lists the claims' holdings of sized GPUs the plugin knows (ClaimView), ordered by GPU,
// namespace and name. A claim is listed from its preparation to its unpreparation (or until the sweep of
// gone claims forgets it), across agent restarts, and while the API server shows it allocated here.
func (p *KubeletPlugin) SizedClaims() []SizedClaim {
	return p.ClaimView().Claims
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

// reservedPodUIDs are the UIDs of the pods a claim is reserved for, sorted.
func reservedPodUIDs(c *resourcev1.ResourceClaim) []types.UID {
	var out []types.UID
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" && r.UID != "" {
			out = append(out, r.UID)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// mergeUIDs is the sorted union of pod UID lists.
func mergeUIDs(lists ...[]types.UID) []types.UID {
	out := slices.Concat(lists...)
	slices.Sort(out)
	return slices.Compact(out)
}
