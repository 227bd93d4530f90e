package app

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// claimLookupTimeout bounds the pod lookup of a connecting shim client: it runs between the client's HELLO
// and its WELCOME (with the class lookup, which shares the resolver's list), within the shim's 1 s
// GPUSHARE_CONNECT_TIMEOUT_MS. A lookup that runs out leaves the client outside any ledger, with its
// per-process limit: never a smaller limit than the claim.
const claimLookupTimeout = 300 * time.Millisecond

// claimLedgers names the claim ledger of a shim client (scheduler.Guards.ClaimOf): the sized claims the
// kubelet plugin prepared on that GPU for the client's pod and the pods linked to it. A ledger is the claim
// guard's group (agent/node's judgeClaims): a pod's claims on one GPU, the pods that share one of them,
// and so on through every claim of those pods, their memory added up; so what the shim lets the group
// allocate is what the guard judges it against. Clients in no sized claim, or whose pod cannot be named
// in time, have none.
func claimLedgers(claims node.SizedClaimSource, pods *podpid.Resolver) func(gpu string, pid int32) (scheduler.Claim, bool) {
	return func(gpu string, pid int32) (scheduler.Claim, bool) {
		var onGPU []dra.SizedClaim
		sized := false
		for _, c := range claims.SizedClaims() {
			if c.GPU == gpu {
				onGPU = append(onGPU, c)
				sized = sized || c.MemoryBytes > 0
			}
		}
		if !sized {
			return scheduler.Claim{}, false // no lookup for GPUs without sized claims
		}
		ctx, cancel := context.WithTimeout(context.Background(), claimLookupTimeout)
		defer cancel()
		ref, ok := pods.Refs(ctx, []int32{pid})[pid]
		if !ok {
			return scheduler.Claim{}, false
		}
		return ledgerOf(onGPU, ref.Namespace, ref.Name)
	}
}

// ledgerOf is the ledger of pod namespace/name among one GPU's sized claims: the claims that list it or a
// pod linked to it through a claim (the guard's group), keyed by their names; none where they give no
// memory.
func ledgerOf(claims []dra.SizedClaim, namespace, name string) (scheduler.Claim, bool) {
	pods := map[string]bool{name: true}
	in := make([]bool, len(claims))
	for grew := true; grew; {
		grew = false
		for i, c := range claims {
			if in[i] || c.Namespace != namespace || !slices.ContainsFunc(c.Pods, func(p string) bool { return pods[p] }) {
				continue
			}
			in[i], grew = true, true
			for _, p := range c.Pods {
				pods[p] = true
			}
		}
	}
	var keys []string
	var mem uint64
	for i, c := range claims {
		if in[i] {
			keys = append(keys, c.Namespace+"/"+c.Name)
			mem += uint64(c.MemoryBytes)
		}
	}
	if mem == 0 {
		return scheduler.Claim{}, false
	}
	slices.Sort(keys)
	return scheduler.Claim{Key: strings.Join(keys, ","), Memory: mem}, true
}
