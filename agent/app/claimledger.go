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

// claimLookupTimeout bounds the pod lookup of a connecting shim client where its ledger needs one (claims
// recorded without their pods' UIDs): it runs between the client's HELLO and its WELCOME (with the class
// lookup, which shares the resolver's list), within the shim's 1 s GPUSHARE_CONNECT_TIMEOUT_MS. A lookup
// that runs out leaves the client outside any ledger, with its per-process limit, until a later lookup
// places it (scheduler/ledgerpeer.go).
const claimLookupTimeout = 300 * time.Millisecond

// podRefs names the pods of processes through the API server (*podpid.Resolver).
type podRefs interface {
	Refs(ctx context.Context, pids []int32) map[int32]podpid.Ref
}

// claimLedgers names the claim ledger of a shim client (scheduler.Guards.ClaimOf): the sized claims the
// kubelet plugin prepared on that GPU for the client's pod and the pods linked to it. A ledger is the claim
// guard's group (agent/node's judgeClaims): a pod's claims on one GPU, the pods that share one of them,
// and so on through every claim of those pods, their memory added up; so what the shim lets the group
// allocate is what the guard judges it against.
//
// The group is found without the API server: the plugin records the UIDs of the pods each claim is
// reserved for, and a process's cgroup names its pod's UID (procRoot, "" for /proc). Only where a claim
// on the GPU was recorded without its pods' UIDs (a checkpoint written before they were kept, until the
// plugin reads the claims from the API server) is the process's pod named through pods, by namespace and
// name; a lookup that fails there leaves the client in no ledger. Clients in no sized claim have none.
func claimLedgers(claims node.SizedClaimSource, procRoot string, pods podRefs) func(gpu string, pid int32) (scheduler.Claim, bool) {
	if procRoot == "" {
		procRoot = "/proc"
	}
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
		uid, inPod := podpid.UIDOf(procRoot, pid)
		if !inPod {
			return scheduler.Claim{}, false // a host process is in no claim
		}
		if uidsRecorded(onGPU) {
			return ledgerOfUID(onGPU, uid)
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

// uidsRecorded says whether every claim's pods are recorded with their UIDs: names and UIDs come from the
// same reservations, so a claim with fewer UIDs than names was recorded (in part) without them, and a
// group found through UIDs alone could miss it.
func uidsRecorded(claims []dra.SizedClaim) bool {
	for _, c := range claims {
		if len(c.PodUIDs) < len(c.Pods) {
			return false
		}
	}
	return true
}

// ledgerOf is the ledger of pod namespace/name among one GPU's sized claims: the claims that list it or a
// pod linked to it through a claim (the guard's group), keyed by their names; none where they give no
// memory.
func ledgerOf(claims []dra.SizedClaim, namespace, name string) (scheduler.Claim, bool) {
	return ledgerOfPod(claims, namespace+"/"+name, func(c dra.SizedClaim) []string {
		out := make([]string, len(c.Pods))
		for i, p := range c.Pods {
			out[i] = c.Namespace + "/" + p
		}
		return out
	})
}

// ledgerOfUID is ledgerOf for the pod of UID uid, through the UIDs the claims record.
func ledgerOfUID(claims []dra.SizedClaim, uid string) (scheduler.Claim, bool) {
	return ledgerOfPod(claims, uid, func(c dra.SizedClaim) []string {
		out := make([]string, len(c.PodUIDs))
		for i, u := range c.PodUIDs {
			out[i] = string(u)
		}
		return out
	})
}

// ledgerOfPod is the ledger of pod among claims, whose pods are named by podsOf in the same spelling.
func ledgerOfPod(claims []dra.SizedClaim, pod string, podsOf func(dra.SizedClaim) []string) (scheduler.Claim, bool) {
	pods := map[string]bool{pod: true}
	in := make([]bool, len(claims))
	for grew := true; grew; {
		grew = false
		for i, c := range claims {
			if in[i] {
				continue
			}
			of := podsOf(c)
			if !slices.ContainsFunc(of, func(p string) bool { return pods[p] }) {
				continue
			}
			in[i], grew = true, true
			for _, p := range of {
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
