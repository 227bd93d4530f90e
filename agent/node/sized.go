package node

import (
	"cmp"
	"context"
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
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// SizedClaimSource lists the sized claims the kubelet plugin prepared (*dra.KubeletPlugin).
type SizedClaimSource = guard.SizedClaimSource

// setSizedClaims fills status.gpus[].sized of the GPUs sized per claim from the prepared claims, and the
// memory their pods use from the accounting's latest snapshot, and judges each against its claims
// (agent/guard); prev is the status published before, whose figures are kept where they moved less than
// the usage thresholds.
func (r *Reconciler) setSizedClaims(sc *scope, gpus []v1alpha1.GPUStatus, prev []v1alpha1.GPUStatus) {
	clearUnsized(gpus, r.Claims != nil)
	setSizedCapacity(gpus, sc.inventory, r.MPSServerMemory)
	if r.Claims == nil {
		return
	}
	var snap accounting.Snapshot
	if r.Usage != nil {
		snap = r.Usage.Latest()
	}
	pass := r.claimGuard().Begin(sizedReads(gpus, snap))
	byGPU := claimsByGPU(pass.Claims())
	prevByUUID := map[string]*v1alpha1.GPUStatus{}
	for i := range prev {
		prevByUUID[prev[i].UUID] = &prev[i]
	}
	for i := range gpus {
		if sizedPerClaim(&gpus[i]) {
			judgeSizedGPU(sc, &gpus[i], pass, byGPU[gpus[i].UUID], snap, prevByUUID[gpus[i].UUID])
			r.Strategies.Shim.publishRefusals(&gpus[i], prevByUUID[gpus[i].UUID])
		}
	}
}

func sizedPerClaim(g *v1alpha1.GPUStatus) bool {
	return g.Applied != nil && g.Applied.Sizing.PerClaim()
}

// clearUnsized removes WithinClaims, carried over from the status before (status.go), from a GPU no
// longer sized, and from every GPU of an agent without the kubelet plugin (withClaims false): they check
// no claims.
func clearUnsized(gpus []v1alpha1.GPUStatus, withClaims bool) {
	for i := range gpus {
		if !withClaims || !sizedPerClaim(&gpus[i]) {
			meta.RemoveStatusCondition(&gpus[i].Conditions, v1alpha1.ConditionWithinClaims)
		}
	}
}

// setSizedCapacity sets what each sized device offers (agent/dra reads it), also where no kubelet plugin
// runs.
func setSizedCapacity(gpus []v1alpha1.GPUStatus, inv gpu.Inventory, mpsServer uint64) {
	for i := range gpus {
		g := &gpus[i]
		if !sizedPerClaim(g) {
			continue
		}
		g.Sized = &v1alpha1.GPUSizedClaims{}
		if dev, found := inv.Device(g.UUID); found {
			g.Sized.MemoryCapacity = resource.NewQuantity(sizedCapacity(dev, g.Applied, mpsServer), resource.BinarySI)
		}
	}
}

// sizedReads are the snapshot's accounts of the sized GPUs it read.
func sizedReads(gpus []v1alpha1.GPUStatus, snap accounting.Snapshot) []accounting.GPU {
	var reads []accounting.GPU
	for i := range gpus {
		if acct, ok := snap.GPU(gpus[i].UUID); ok && acct.Err == nil && sizedPerClaim(&gpus[i]) {
			reads = append(reads, acct)
		}
	}
	return reads
}

// judgeSizedGPU fills one sized GPU's claims and their use, judges its pods against their claims and
// sets WithinClaims; the groups over their claims go to sc for the guard's phase. prev is the GPU's
// status published before (nil: none).
func judgeSizedGPU(sc *scope, g *v1alpha1.GPUStatus, pass *guard.ClaimPass, claims []dra.SizedClaim, snap accounting.Snapshot, prev *v1alpha1.GPUStatus) {
	acct, read := snap.GPU(g.UUID)
	read = read && acct.Err == nil
	var prevSized *v1alpha1.GPUSizedClaims
	var prevConds []metav1.Condition
	if prev != nil {
		prevSized, prevConds = prev.Sized, prev.Conditions
	}
	capacity := g.Sized.MemoryCapacity
	g.Sized = sizedStatus(claims, acct, read, prevSized)
	g.Sized.MemoryCapacity = capacity
	var over []guard.OverClaim
	var unknown []vacate.PodRef
	if read {
		over, unknown = pass.Judge(acct)
	}
	guard.SetWithinClaims(g, over, unknown, read, prevConds)
	if len(over) > 0 {
		if sc.overClaims == nil {
			sc.overClaims = map[string][]guard.OverClaim{}
		}
		sc.overClaims[g.UUID] = over
	}
}

// claimGuard is the claim guard over r.Claims, built at first use (the pass and the accounting's
// goroutine share it).
func (r *Reconciler) claimGuard() *guard.Claims {
	r.claimsOnce.Do(func() {
		r.claims = &guard.Claims{Source: r.Claims, Evictor: r.ClaimEvictor, Recorder: r.Recorder, NodeName: r.NodeName, Clock: r.Clock}
	})
	return r.claims
}

// guardSizedClaims is the pass's phase that warns about and, where the GPU's sizing says Evict, evicts
// the pods over their claims (guard.Claims.Guard); it runs after the status is computed.
func (r *Reconciler) guardSizedClaims(ctx context.Context, sc *scope) {
	if r.Claims == nil {
		return
	}
	r.claimGuard().Guard(ctx, sc.node.Status.GPUs, sc.overClaims)
}

// overClaimsChanged says whether a snapshot puts other pods over their claims than the last pass saw.
func (r *Reconciler) overClaimsChanged(snap accounting.Snapshot) bool {
	return r.Claims != nil && r.claimGuard().Changed(snap)
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
