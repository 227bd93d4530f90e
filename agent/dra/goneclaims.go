package dra

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The kubelet unprepares every claim it prepared, but not always: a pod removed while the agent was down,
// a kubelet whose own state was lost. A checkpoint entry left behind keeps its devices refused to every
// other claim (ErrDeviceInUse) for ever, so the plugin drops the entries whose ResourceClaim is gone.
const (
	// DefaultGoneClaimsInterval is how often the checkpoint's claims are looked up after the first time.
	DefaultGoneClaimsInterval = 10 * time.Minute
	// firstSweepTimeout bounds the lookups made before the plugin serves: an API server that does not
	// answer delays the kubelet's first call by no more than this, and the periodic sweep goes on later.
	firstSweepTimeout = 30 * time.Second
	// claimGetTimeout bounds one lookup.
	claimGetTimeout = 10 * time.Second
)

// ForgetGoneClaims looks up, one GET each, the ResourceClaim of every claim the checkpoint holds, and
// drops the entries whose claim no longer exists, exists under another UID (deleted and created again
// with the same name: a different claim), or is no longer allocated in this node's pool (deallocated, or
// allocated on another node). It removes their CDI specs and writes the checkpoint; it returns
// how many it dropped. A claim that cannot be looked up (the API server does not answer, the request is
// refused) is kept: not knowing is not "gone". The error is the first lookup or write that failed.
func (p *KubeletPlugin) ForgetGoneClaims(ctx context.Context, kube kubernetes.Interface) (int, error) {
	type ref struct {
		uid             types.UID
		namespace, name string
	}
	p.mu.Lock()
	refs := make([]ref, 0, len(p.cp.Claims))
	for uid, pc := range p.cp.Claims {
		refs = append(refs, ref{uid: uid, namespace: pc.Namespace, name: pc.Name})
	}
	p.mu.Unlock()
	slices.SortFunc(refs, func(a, b ref) int { return cmp.Compare(a.uid, b.uid) })

	// The lookups run without the lock, so the kubelet's calls are not held up by the API server. An
	// entry found gone cannot come back meanwhile: the kubelet prepares only claims it reads from the API
	// server, by UID.
	var firstErr error
	var gone []types.UID
	for _, r := range refs {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		getCtx, cancel := context.WithTimeout(ctx, claimGetTimeout)
		claim, err := kube.ResourceV1().ResourceClaims(r.namespace).Get(getCtx, r.name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			p.log.Info("Forgetting a prepared ResourceClaim that no longer exists", "claim", r.namespace+"/"+r.name, "claimUID", r.uid)
			gone = append(gone, r.uid)
		case err != nil:
			p.log.Error(err, "Cannot look up a prepared ResourceClaim; keeping it", "claim", r.namespace+"/"+r.name, "claimUID", r.uid)
			if firstErr == nil {
				firstErr = fmt.Errorf("looking up ResourceClaim %s/%s: %w", r.namespace, r.name, err)
			}
		case claim.UID != r.uid:
			p.log.Info("Forgetting a prepared ResourceClaim whose name now belongs to another claim", "claim", r.namespace+"/"+r.name,
				"claimUID", r.uid, "currentUID", claim.UID)
			gone = append(gone, r.uid)
		case !p.allocatedHere(claim):
			// Deallocated, or allocated again on another node: its devices here are no longer its.
			p.log.Info("Forgetting a prepared ResourceClaim no longer allocated on this node", "claim", r.namespace+"/"+r.name, "claimUID", r.uid)
			gone = append(gone, r.uid)
		}
	}
	if len(gone) == 0 {
		return 0, firstErr
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// Stopped meanwhile (the agent exits): nothing is written after.
		return 0, err
	}
	next := p.cp.clone()
	var dropped []types.UID
	for _, uid := range gone {
		// The kubelet may have unprepared it meanwhile.
		if _, ok := next.Claims[uid]; ok {
			delete(next.Claims, uid)
			dropped = append(dropped, uid)
		}
	}
	if len(dropped) == 0 {
		return 0, firstErr
	}
	if err := p.commit(next); err != nil {
		return 0, err
	}
	// The specs go once the checkpoint no longer names their claims; a spec left by a failed removal is
	// harmless (no device of it is refused) and the kubelet's unprepare by UID removes it too.
	for _, uid := range dropped {
		if err := p.cdi.remove(uid); err != nil {
			p.log.Error(err, "Removing the CDI spec of a forgotten ResourceClaim", "claimUID", uid)
		}
	}
	return len(dropped), firstErr
}

// forgetGoneClaimsEvery runs ForgetGoneClaims every interval until ctx ends.
func (p *KubeletPlugin) forgetGoneClaimsEvery(ctx context.Context, kube kubernetes.Interface, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Errors are logged per claim; the next tick tries again.
		_, _ = p.ForgetGoneClaims(ctx, kube)
		p.reconcileMIG(ctx, kube)
		// Forgotten claims' namespace daemons go; one that could not be quit before is tried again.
		p.requestMPSSync()
	}
}
