package node

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// SizedClaimSource lists the sized claims the kubelet plugin prepared (*dra.KubeletPlugin).
type SizedClaimSource interface {
	SizedClaims() []dra.SizedClaim
}

// setSizedClaims fills status.gpus[].sized of the GPUs sized per claim from the prepared claims, and the
// memory their pods use from the accounting's latest snapshot; prev is the status published before, whose
// figures are kept where they moved less than the usage thresholds.
func (r *Reconciler) setSizedClaims(sc *scope, gpus []v1alpha1.GPUStatus, prev []v1alpha1.GPUStatus) {
	for i := range gpus {
		if r.Claims == nil || gpus[i].Applied == nil || !gpus[i].Applied.Sizing.PerClaim() {
			// Carried over from the status before (status.go): a GPU no longer sized, or an agent without
			// the kubelet plugin, checks no claims.
			meta.RemoveStatusCondition(&gpus[i].Conditions, v1alpha1.ConditionWithinClaims)
		}
	}
	for i := range gpus {
		g := &gpus[i]
		if g.Applied == nil || !g.Applied.Sizing.PerClaim() {
			continue
		}
		// What the sized device offers (agent/dra reads it), also where no kubelet plugin runs.
		g.Sized = &v1alpha1.GPUSizedClaims{}
		if dev, found := sc.inventory.Device(g.UUID); found {
			g.Sized.MemoryCapacity = resource.NewQuantity(sizedCapacity(dev, g.Applied, r.MPSServerMemory), resource.BinarySI)
		}
	}
	if r.Claims == nil {
		return
	}
	k := r.claimKnowledge()
	released := r.claims.releasedPods(k.claims, r.clock().Now())
	byGPU := claimsByGPU(k.claims)
	prevByUUID := map[string]*v1alpha1.GPUSizedClaims{}
	prevConds := map[string][]metav1.Condition{}
	for _, g := range prev {
		prevByUUID[g.UUID] = g.Sized
		prevConds[g.UUID] = g.Conditions
	}
	var snap accounting.Snapshot
	if r.Usage != nil {
		snap = r.Usage.Latest()
	}
	var reads []accounting.GPU
	for _, g := range gpus {
		if acct, ok := snap.GPU(g.UUID); ok && acct.Err == nil && g.Applied != nil && g.Applied.Sizing.PerClaim() {
			reads = append(reads, acct)
		}
	}
	seen := r.claims.seenPods(reads)
	askedSync := false
	for i := range gpus {
		g := &gpus[i]
		if g.Applied == nil || !g.Applied.Sizing.PerClaim() {
			continue
		}
		acct, ok := snap.GPU(g.UUID)
		if ok && acct.Err != nil {
			ok = false
		}
		capacity := g.Sized.MemoryCapacity
		g.Sized = sizedStatus(byGPU[g.UUID], acct, ok, prevByUUID[g.UUID])
		g.Sized.MemoryCapacity = capacity
		var over []overClaim
		var unknown []vacate.PodRef
		if ok {
			over, unknown = judgeClaims(k, acct, released, seen)
		}
		if v, can := r.Claims.(claimViewer); can && len(unknown) > 0 && !askedSync {
			// A read of the node's claims that begins now knows them (the plugin spaces the reads).
			v.RequestClaimSync()
			askedSync = true
		}
		setWithinClaims(g, over, unknown, ok, prevConds[g.UUID])
		if len(over) > 0 {
			if sc.overClaims == nil {
				sc.overClaims = map[string][]overClaim{}
			}
			sc.overClaims[g.UUID] = over
		}
	}
}

// DefaultMPSServerMemory is the device memory an MPS server is taken to hold itself (--mps-server-memory):
// a bound to confirm on each GPU model with nvidia-smi --query-compute-apps while a server runs (docs/dra.md).
const DefaultMPSServerMemory = 256 << 20

// sizedCapacity is the memory a sized GPU offers claims: what processes can allocate at all, the GPU's
// memory less the driver's reserve, and on MPS less the MPS server's own memory. Offering NVML's total
// would let the scheduler pack claims that cannot all be held at once.
func sizedCapacity(dev gpu.Device, a *v1alpha1.AppliedSharing, mpsServer uint64) int64 {
	taken := dev.MemoryReservedBytes
	if a != nil && a.Strategy == v1alpha1.StrategyMPS {
		taken += mpsServer
	}
	if taken >= dev.MemoryBytes {
		return 0
	}
	return int64(dev.MemoryBytes - taken)
}

// claimsByGPU groups the prepared sized claims by the GPU they hold.
func claimsByGPU(claims []dra.SizedClaim) map[string][]dra.SizedClaim {
	out := map[string][]dra.SizedClaim{}
	for _, c := range claims {
		out[c.GPU] = append(out[c.GPU], c)
	}
	return out
}

// sizedStatus is one sized GPU's claims; acct is its account when read (ok).
func sizedStatus(claims []dra.SizedClaim, acct accounting.GPU, read bool, prev *v1alpha1.GPUSizedClaims) *v1alpha1.GPUSizedClaims {
	out := &v1alpha1.GPUSizedClaims{}
	var mem, compute int64
	for _, c := range claims {
		mem += c.MemoryBytes
		compute += c.ComputePercent
	}
	out.MemoryAllocated = resource.NewQuantity(mem, resource.BinarySI)
	out.ComputeAllocated = int32(min(compute, dra.ComputeCapacity))
	// The largest first, then by name, so the choice is stable between passes.
	sorted := slices.Clone(claims)
	slices.SortStableFunc(sorted, func(a, b dra.SizedClaim) int {
		return cmp.Or(cmp.Compare(b.MemoryBytes, a.MemoryBytes), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if n := len(sorted) - v1alpha1.MaxSizedClaimsInStatus; n > 0 {
		out.OmittedClaims = int32(n)
		sorted = sorted[:v1alpha1.MaxSizedClaimsInStatus]
	}
	prevUsed := map[string]*resource.Quantity{}
	if prev != nil {
		for _, c := range prev.Claims {
			prevUsed[c.Namespace+"/"+c.Name] = c.MemoryUsed
		}
	}
	for _, c := range sorted {
		sc := v1alpha1.SizedClaimStatus{Namespace: c.Namespace, Name: c.Name, Compute: int32(min(c.ComputePercent, dra.ComputeCapacity)),
			Memory: resource.NewQuantity(c.MemoryBytes, resource.BinarySI)}
		sc.Pods = c.Pods[:min(len(c.Pods), v1alpha1.MaxSizedClaimPodsInStatus)]
		if read {
			sc.MemoryUsed = steadyMemory(podsMemory(acct, c.Namespace, c.Pods), prevUsed[c.Namespace+"/"+c.Name])
		}
		out.Claims = append(out.Claims, sc)
	}
	return out
}

// podsMemory sums the memory the pods' containers hold on the GPU. A pod that holds two claims of the
// GPU counts whole against each: NVML cannot tell which claim a process's memory is under.
func podsMemory(g accounting.GPU, namespace string, pods []string) uint64 {
	var sum uint64
	for _, c := range g.Containers {
		if c.Namespace == namespace && slices.Contains(pods, c.Name) {
			sum += c.MemoryBytes
		}
	}
	return sum
}

// memoryAllocatedSummary renders each sized GPU's allocated memory for the wide table: "0:30Gi/80Gi".
func memoryAllocatedSummary(gpus []v1alpha1.GPUStatus) string {
	sorted := append([]v1alpha1.GPUStatus(nil), gpus...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var parts []string
	for _, g := range sorted {
		if g.Sized == nil || g.Sized.MemoryAllocated == nil {
			continue
		}
		total := "?"
		switch {
		case g.Sized.MemoryCapacity != nil:
			total = humanGi(g.Sized.MemoryCapacity.Value())
		case g.Memory != nil:
			total = humanGi(g.Memory.Value())
		}
		parts = append(parts, fmt.Sprintf("%d:%s/%s", g.Index, humanGi(g.Sized.MemoryAllocated.Value()), total))
	}
	return strings.Join(parts, " ")
}
