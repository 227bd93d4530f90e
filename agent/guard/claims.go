package guard

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// claimEvictRetry spaces the evictions of one pod over its claims that did not end it (a
// PodDisruptionBudget that allows none now, an API server away).
const claimEvictRetry = 10 * time.Second

// maxOverClaimsInMessage bounds the pods a WithinClaims=False message names.
const maxOverClaimsInMessage = 4

func humanBytes(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

// SetWithinClaims sets a sized GPU's WithinClaims condition from the groups over their claims and the
// pods not judged; unread (the accounting has not read the GPU) keeps what was published before.
func SetWithinClaims(g *v1alpha1.GPUStatus, over []OverClaim, unknown []vacate.PodRef, read bool, prev []metav1.Condition) {
	if !read {
		if c := meta.FindStatusCondition(prev, v1alpha1.ConditionWithinClaims); c != nil {
			meta.SetStatusCondition(&g.Conditions, *c)
		}
		return
	}
	var notJudged string
	if len(unknown) > 0 {
		names := make([]string, 0, maxOverClaimsInMessage)
		for _, p := range unknown[:min(len(unknown), maxOverClaimsInMessage)] {
			names = append(names, p.String())
		}
		notJudged = "pods whose claims are not known yet, not judged: " + strings.Join(names, ", ")
		if n := len(unknown) - maxOverClaimsInMessage; n > 0 {
			notJudged += fmt.Sprintf(" and %d more", n)
		}
	}
	if len(over) == 0 {
		if notJudged != "" {
			setCondition(g, metav1.ConditionUnknown, v1alpha1.ReasonClaimsUnknown, notJudged)
			return
		}
		setCondition(g, metav1.ConditionTrue, v1alpha1.ReasonAsClaimed,
			"every pod on the GPU holds no more memory than its claims")
		return
	}
	var names []string
	for _, o := range over[:min(len(over), maxOverClaimsInMessage)] {
		names = append(names, o.String())
	}
	msg := strings.Join(names, "; ")
	if n := len(over) - maxOverClaimsInMessage; n > 0 {
		msg += fmt.Sprintf("; and %d more", n)
	}
	action := "reported"
	if g.Applied.Sizing.Evicts() {
		action = "evicted (sizing onExceed Evict)"
	}
	msg = fmt.Sprintf("pods over their claims, %s: %s", action, msg)
	if notJudged != "" {
		msg += "; " + notJudged
	}
	setCondition(g, metav1.ConditionFalse, v1alpha1.ReasonClaimExceeded, msg)
}

func setCondition(g *v1alpha1.GPUStatus, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&g.Conditions, metav1.Condition{Type: v1alpha1.ConditionWithinClaims, Status: status, Reason: reason, Message: msg})
}

// SizedClaimSource lists the sized claims the kubelet plugin prepared (*dra.KubeletPlugin).
type SizedClaimSource interface {
	SizedClaims() []dra.SizedClaim
}

// Claims is the claim guard of the GPUs sized per claim: it judges each GPU's ledger groups against their
// claims (claimjudge.go), sets WithinClaims, and warns about and, where the GPU's sizing says Evict,
// evicts the pods over their claims. It remembers the pods over their claims, to warn once per breach and
// space evictions. Its methods are safe for the accounting's goroutine and the reconciler's pass together.
type Claims struct {
	// Source lists the prepared claims.
	Source SizedClaimSource
	// Evictor evicts; nil only reports.
	Evictor vacate.Evictor
	// Recorder emits the warning events on the pods; nil emits none.
	Recorder events.EventRecorder
	NodeName string
	// Clock decides release times and eviction retries; nil means the real clock.
	Clock clock.PassiveClock

	mu sync.Mutex
	// sized lists the GPUs sized per claim at the last pass, and over, per GPU, the pods over their
	// claims then (OverClaimsChanged compares).
	sized map[string]bool
	over  map[string][]vacate.PodRef
	// warned and evicted are keyed by GPU and pod; an entry leaves with the breach.
	warned  map[string]bool
	evicted map[string]time.Time
	// claimed are the pods with sized claims at the last pass; released, those whose claims went since,
	// with when a pass first saw them gone (releasedPods).
	claimed  map[vacate.PodRef]bool
	released map[vacate.PodRef]time.Time
	// seen is when each pod with memory on a sized GPU was first seen there (claimKnowledge.knows); an
	// entry leaves with the pod's last process.
	seen map[vacate.PodRef]time.Time
}

// seenPods records when each pod with memory on the read sized GPUs was first seen, forgets those no
// longer on any, and returns a copy.
func (cg *Claims) seenPods(reads []accounting.GPU) map[vacate.PodRef]time.Time {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.seen == nil {
		cg.seen = map[vacate.PodRef]time.Time{}
	}
	now := map[vacate.PodRef]bool{}
	for _, g := range reads {
		for _, c := range g.Containers {
			if c.Name == "" {
				continue
			}
			p := vacate.PodRef{Namespace: c.Namespace, Name: c.Name}
			now[p] = true
			if _, ok := cg.seen[p]; !ok {
				cg.seen[p] = g.At
			}
		}
	}
	for p := range cg.seen {
		if !now[p] {
			delete(cg.seen, p)
		}
	}
	return maps.Clone(cg.seen)
}

// releasedHold is how long a released pod is remembered: far longer than a read of the accounting takes
// to be newer than its release (CheckInterval while claims exist, 10 s otherwise).
const releasedHold = time.Minute

// releasedPods notes the pods whose sized claims are gone since the last pass and returns them with when
// this pass saw it. The kubelet unprepares a pod's claims once its containers have stopped, but the
// accounting's latest read may be older than that and still show the ended processes, which now hold
// memory of no claim: a pod is judged again only on a read newer than its release (an evicted Job's
// finished pod must not be evicted for memory it no longer holds).
func (cg *Claims) releasedPods(claims []dra.SizedClaim, now time.Time) map[vacate.PodRef]time.Time {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	claimed := map[vacate.PodRef]bool{}
	for _, c := range claims {
		for _, p := range c.Pods {
			claimed[vacate.PodRef{Namespace: c.Namespace, Name: p}] = true
		}
	}
	if cg.released == nil {
		cg.released = map[vacate.PodRef]time.Time{}
	}
	for p := range cg.claimed {
		if !claimed[p] {
			cg.released[p] = now
		}
	}
	for p, at := range cg.released {
		if claimed[p] || now.Sub(at) > releasedHold {
			delete(cg.released, p)
		}
	}
	cg.claimed = claimed
	return maps.Clone(cg.released)
}

// OverClaimsChanged says whether a snapshot puts other pods over their claims than the last pass saw,
// which is worth a pass of its own: the accounting reads every CheckInterval while claims exist.
func (c *Claims) Changed(snap accounting.Snapshot) bool {
	c.mu.Lock()
	sized, over, released, seen := c.sized, c.over, maps.Clone(c.released), maps.Clone(c.seen)
	c.mu.Unlock()
	if len(sized) == 0 {
		return false
	}
	k := c.knowledge()
	for _, g := range snap.GPUs {
		if !sized[g.UUID] || g.Err != nil {
			continue
		}
		var now []vacate.PodRef
		groups, _ := judgeClaims(k, g, released, seen)
		for _, o := range groups {
			for _, p := range o.pods {
				now = append(now, p.PodRef)
			}
		}
		if !slices.Equal(now, over[g.UUID]) {
			return true
		}
	}
	return false
}

// Guard warns about and, where the GPU's sizing says Evict, evicts the pods over their claims. It
// runs in the pass, after the status is computed; a failed eviction is retried after claimEvictRetry.
func (cg *Claims) Guard(ctx context.Context, gpus []v1alpha1.GPUStatus, over map[string][]OverClaim) {
	log := ctrl.LoggerFrom(ctx)
	var evict []claimPod
	cg.mu.Lock()
	if cg.warned == nil {
		cg.warned, cg.evicted = map[string]bool{}, map[string]time.Time{}
	}
	now := cg.now()
	still := map[string]bool{}
	cg.over, cg.sized = map[string][]vacate.PodRef{}, map[string]bool{}
	for _, g := range gpus {
		if g.Applied != nil && g.Applied.Sizing.PerClaim() {
			cg.sized[g.UUID] = true
		}
		for _, o := range over[g.UUID] {
			for _, p := range o.pods {
				culprit := slices.ContainsFunc(o.culprits, func(c claimPod) bool { return c.PodRef == p.PodRef })
				key := g.UUID + "/" + p.PodRef.String()
				still[key] = true
				cg.over[g.UUID] = append(cg.over[g.UUID], p.PodRef)
				if !cg.warned[key] {
					cg.warned[key] = true
					log.Info("Pod over its claims", "pod", p.PodRef, "gpu", g.UUID, "used", o.used, "claimed", o.claimed)
					if cg.Recorder != nil {
						pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.uid}}
						cg.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, v1alpha1.ReasonClaimExceeded, "Check",
							"GPU %d (%s) on %s: %s", g.Index, g.UUID, cg.NodeName, o)
					}
				}
				if !culprit || !g.Applied.Sizing.Evicts() || cg.Evictor == nil {
					continue // a pod within the claims that list it stays, though its group is over
				}
				if last, ok := cg.evicted[key]; ok && now.Sub(last) < claimEvictRetry {
					continue
				}
				cg.evicted[key] = now
				evict = append(evict, p)
			}
		}
	}
	for key := range cg.warned {
		if !still[key] {
			delete(cg.warned, key)
			delete(cg.evicted, key)
		}
	}
	cg.mu.Unlock()

	// Outside the lock: the accounting's goroutine reads cg.over, and must not wait on the API server.
	for _, o := range evict {
		cctx, cancel := context.WithTimeout(ctx, claimEvictRetry)
		err := cg.Evictor.Evict(cctx, o.PodRef, o.uid)
		cancel()
		switch {
		case err == nil:
			log.Info("Evicted a pod over its claims", "pod", o.PodRef)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// Gone already, or a pod of the same name with another uid: not the one over its claims.
		default:
			log.Info("Cannot evict a pod over its claims yet", "pod", o.PodRef, "error", err.Error())
		}
	}
}

func (cg *Claims) now() time.Time {
	if cg.Clock == nil {
		return time.Now()
	}
	return cg.Clock.Now()
}

// ClaimPass is what one reconciler pass knows of the claims: the claims and what the source does not
// know, the pods whose claims went since the last pass, and when each pod was first seen.
type ClaimPass struct {
	c              *Claims
	k              claimKnowledge
	released, seen map[vacate.PodRef]time.Time
	askedSync      bool
}

// Begin starts a pass over the sized GPUs the accounting read (reads).
func (cg *Claims) Begin(reads []accounting.GPU) *ClaimPass {
	k := cg.knowledge()
	released := cg.releasedPods(k.claims, cg.now())
	return &ClaimPass{c: cg, k: k, released: released, seen: cg.seenPods(reads)}
}

// Claims are the prepared sized claims the pass knows.
func (p *ClaimPass) Claims() []dra.SizedClaim { return p.k.claims }

// Judge lists the GPU's ledger groups over their claims and the pods not judged (judgeClaims). The
// first GPU of a pass with pods not judged asks the source to read the node's claims again: a read that
// begins now knows them (the plugin spaces the reads).
func (p *ClaimPass) Judge(acct accounting.GPU) ([]OverClaim, []vacate.PodRef) {
	over, unknown := judgeClaims(p.k, acct, p.released, p.seen)
	if v, can := p.c.Source.(claimViewer); can && len(unknown) > 0 && !p.askedSync {
		v.RequestClaimSync()
		p.askedSync = true
	}
	return over, unknown
}
