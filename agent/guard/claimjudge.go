package guard

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/vacate"
)

// A claim of M bytes bounds the device memory its pods' processes hold as NVML counts it, their CUDA
// contexts included (what the limits leave for contexts is the context reserve: docs/dra.md). The guard
// judges per ledger group: the pods of a GPU linked by the claims they share there (a claim reserved for
// two pods links them; a pod with two claims of the GPU links both), whose processes together must hold
// no more than the group's claims together. It judges a group only when it knows every claim of every
// pod in it; a pod it does not is "unknown": named in the condition, never evicted.

// claimKnowledge is what the guard knows of the node's sized claims (dra.ClaimView).
type claimKnowledge struct {
	claims []dra.SizedClaim
	// uncertain pods are named by a claim whose GPU or amounts are not known.
	uncertain map[vacate.PodRef]bool
	// syncedAt is when the last read of the node's claims from the API server began; a pod first seen on
	// a GPU before then has every claim it uses in that read.
	syncedAt time.Time
	// whole: the source knows every claim with all its pods at all times (no read to wait for).
	whole bool
}

// claimViewer is a SizedClaimSource that also says what it does not know and can read the API server
// again (*dra.KubeletPlugin).
type claimViewer interface {
	ClaimView() dra.ClaimView
	RequestClaimSync()
}

// knowledge reads c.Source.
func (c *Claims) knowledge() claimKnowledge {
	v, ok := c.Source.(claimViewer)
	if !ok {
		return claimKnowledge{claims: c.Source.SizedClaims(), whole: true}
	}
	view := v.ClaimView()
	k := claimKnowledge{claims: view.Claims, syncedAt: view.SyncedAt, uncertain: map[vacate.PodRef]bool{}}
	for _, p := range view.Uncertain {
		k.uncertain[vacate.PodRef{Namespace: p.Namespace, Name: p.Name}] = true
	}
	return k
}

// knows says whether every claim of pod, first seen on a GPU at seen, is known.
func (k claimKnowledge) knows(pod vacate.PodRef, seen time.Time) bool {
	if k.uncertain[pod] {
		return false
	}
	return k.whole || (!k.syncedAt.IsZero() && k.syncedAt.After(seen))
}

// claimPod is a pod of a ledger group that holds memory of the GPU.
type claimPod struct {
	vacate.PodRef
	// uid is the pod's, where the accounting knows it: an eviction's precondition, so a pod recreated
	// under the same name (a StatefulSet's) is not evicted for its predecessor.
	uid types.UID
}

// OverClaim is a ledger group whose pods' processes hold more of a sized GPU's memory than its claims.
type OverClaim struct {
	// pods are the group's pods with processes on the GPU, sorted.
	pods          []claimPod
	used, claimed int64
	// culprits are the pods to evict, sorted: those that alone hold more than the claims that list them,
	// where any does; otherwise those with memory outside the shim's ledgers (unledgeredPods), where any
	// has; otherwise the excess comes from the sharing itself, no pod can be told apart, and they are all
	// of pods.
	culprits []claimPod
}

func (o OverClaim) String() string {
	names := make([]string, len(o.pods))
	for i, p := range o.pods {
		names[i] = p.PodRef.String()
	}
	if len(names) == 1 {
		return fmt.Sprintf("%s holds %s, its claims %s", names[0], humanBytes(o.used), humanBytes(o.claimed))
	}
	return fmt.Sprintf("%s and %s hold %s, their claims %s", strings.Join(names[:len(names)-1], ", "), names[len(names)-1],
		humanBytes(o.used), humanBytes(o.claimed))
}

// judgeClaims lists, sorted, the ledger groups of the GPU over their claims, and the pods with memory
// on it that cannot be judged yet. A pod whose claims are known and include none of the GPU has claimed
// nothing there: on a GPU sized per claim only claims give a pod the GPU (the device plugin does not
// advertise it), so such a pod reached it another way. A group with a pod not known is not judged. A
// pod in released is judged only on a read made after its claims went (releasedPods). seen says when
// each pod was first seen on a sized GPU; a pod missing there was first seen in acct.
func judgeClaims(k claimKnowledge, acct accounting.GPU, released, seen map[vacate.PodRef]time.Time) ([]OverClaim, []vacate.PodRef) {
	links, claimedBy, own := linkClaimPods(k, acct.UUID)
	used, uids := podMemory(acct)
	unledgered := unledgeredPods(acct)
	type group struct {
		pods          []claimPod
		used, claimed int64
		unknown       bool
	}
	groups := map[vacate.PodRef]*group{}
	groupOf := func(p vacate.PodRef) *group {
		root := links.find(p)
		g, ok := groups[root]
		if !ok {
			g = &group{}
			groups[root] = g
		}
		return g
	}
	for p, c := range claimedBy {
		groupOf(p).claimed += c
	}
	var unknown []vacate.PodRef
	for p, u := range used {
		if at, ok := released[p]; ok && !acct.At.After(at) {
			continue
		}
		first, ok := seen[p]
		if !ok {
			first = acct.At
		}
		g := groupOf(p)
		if !k.knows(p, first) {
			unknown = append(unknown, p)
			g.unknown = true
		}
		g.used += u
		g.pods = append(g.pods, claimPod{PodRef: p, uid: uids[p]})
	}
	var over []OverClaim
	for _, g := range groups {
		if g.unknown || len(g.pods) == 0 || g.used <= g.claimed {
			continue
		}
		slices.SortFunc(g.pods, func(a, b claimPod) int { return strings.Compare(a.String(), b.String()) })
		o := OverClaim{pods: g.pods, used: g.used, claimed: g.claimed}
		for _, p := range g.pods {
			if used[p.PodRef] > own[p.PodRef] {
				o.culprits = append(o.culprits, p)
			}
		}
		if len(o.culprits) == 0 {
			// No pod alone is past its claims. Where some of the group's memory is held by processes no
			// shim scheduler accounts (a process that dropped the shim on a shim GPU), that memory is
			// outside the ledgers that keep the others within the claims: its pods are the culprits.
			for _, p := range g.pods {
				if unledgered[p.PodRef] {
					o.culprits = append(o.culprits, p)
				}
			}
		}
		if len(o.culprits) == 0 {
			o.culprits = g.pods
		}
		over = append(over, o)
	}
	slices.SortFunc(over, func(a, b OverClaim) int { return strings.Compare(a.String(), b.String()) })
	slices.SortFunc(unknown, func(a, b vacate.PodRef) int { return strings.Compare(a.String(), b.String()) })
	return over, unknown
}

// podLinks is a union-find over pods: two pods are one ledger group when a claim on the GPU lists both.
type podLinks map[vacate.PodRef]vacate.PodRef

func (l podLinks) find(p vacate.PodRef) vacate.PodRef {
	q, ok := l[p]
	if !ok || q == p {
		return p
	}
	root := l.find(q)
	l[p] = root
	return root
}

func (l podLinks) link(a, b vacate.PodRef) {
	for _, p := range []vacate.PodRef{a, b} {
		if _, ok := l[p]; !ok {
			l[p] = p
		}
	}
	if ra, rb := l.find(a), l.find(b); ra != rb {
		l[rb] = ra
	}
}

// linkClaimPods links the pods of each claim on GPU uuid, sums each claim's memory under its first pod
// (summed per group by the caller), and sums for each pod the claims that list it (own).
func linkClaimPods(k claimKnowledge, uuid string) (links podLinks, claimedBy, own map[vacate.PodRef]int64) {
	links, claimedBy, own = podLinks{}, map[vacate.PodRef]int64{}, map[vacate.PodRef]int64{}
	for _, c := range k.claims {
		if c.GPU != uuid || len(c.Pods) == 0 {
			continue
		}
		first := vacate.PodRef{Namespace: c.Namespace, Name: c.Pods[0]}
		claimedBy[first] += c.MemoryBytes
		for _, name := range c.Pods {
			p := vacate.PodRef{Namespace: c.Namespace, Name: name}
			links.link(first, p)
			own[p] += c.MemoryBytes
		}
	}
	return links, claimedBy, own
}

// unledgeredPods are the pods with memory of the GPU in a process that is no shim client, where others
// are: on a shim GPU, the pods whose process dropped the shim. Where no process is a shim client (an MPS
// GPU, a read without the schedulers' clients) it is empty: no pod can be told apart that way.
func unledgeredPods(acct accounting.GPU) map[vacate.PodRef]bool {
	byPID := map[int32]accounting.Process{}
	clients := false
	for _, p := range acct.Processes {
		byPID[p.PID] = p
		clients = clients || p.Shim != nil
	}
	out := map[vacate.PodRef]bool{}
	if !clients {
		return out
	}
	for _, c := range acct.Containers {
		for _, pid := range c.PIDs {
			if p, ok := byPID[pid]; ok && c.Name != "" && p.Shim == nil && p.MemoryKnown && p.MemoryBytes > 0 {
				out[vacate.PodRef{Namespace: c.Namespace, Name: c.Name}] = true
			}
		}
	}
	return out
}

// podMemory sums the GPU's containers by pod: the memory each pod's processes hold, and its UID.
func podMemory(acct accounting.GPU) (map[vacate.PodRef]int64, map[vacate.PodRef]types.UID) {
	used := map[vacate.PodRef]int64{}
	uids := map[vacate.PodRef]types.UID{}
	for _, c := range acct.Containers {
		if c.Name == "" {
			continue // a process of no pod: the MPS server, something on the host
		}
		p := vacate.PodRef{Namespace: c.Namespace, Name: c.Name}
		used[p] += int64(c.MemoryBytes)
		uids[p] = types.UID(c.UID)
	}
	return used, uids
}
