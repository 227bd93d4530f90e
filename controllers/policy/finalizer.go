package policy

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// restoreDefault holds a deleting policy until no GPUNode lists it in spec (the resolver has rewritten
// its GPUs to the default or to the next policy) and no agent reports it applied any more, or until
// RestoreTimeout after the deletion began. The bound matters: a node that is down never answers, and a
// policy that can never be deleted blocks GitOps syncs and namespace-less cleanups.
func (r *Reconciler) restoreDefault(ctx context.Context, s *scope) error {
	p := s.policy
	if !controllerutil.ContainsFinalizer(p, Finalizer) {
		s.released = true
		return nil
	}
	remaining := StillConfigured(p.Name, s.nodes)
	timeout := r.RestoreTimeout
	if timeout <= 0 {
		timeout = DefaultRestoreTimeout
	}
	deadline := p.DeletionTimestamp.Add(timeout)
	now := r.now()
	if len(remaining) > 0 && now.Before(deadline) {
		SetRestoringConditions(p, remaining, metav1.NewTime(deadline))
		// Agents' acks arrive as GPUNode events; the requeue only polls the bound, which emits none.
		s.requeue = deadline.Sub(now) + time.Second
		return nil
	}
	reason, note, kind := v1.ReasonDefaultRestored, "every GPU the policy configured runs the default (Exclusive)", corev1.EventTypeNormal
	if len(remaining) > 0 {
		reason, kind = v1.ReasonRestoreTimedOut, corev1.EventTypeWarning
		note = fmt.Sprintf("gave up after %s waiting for agents to confirm the default on %d GPUs (%s); the default stays in their GPUNode spec",
			timeout, len(remaining), refs(remaining, len(remaining)))
	}
	patch := client.MergeFrom(p.DeepCopy())
	controllerutil.RemoveFinalizer(p, Finalizer)
	if err := r.Client.Patch(ctx, p, patch); err != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	s.released = true
	forgetMetrics(p.Name)
	logf.FromContext(ctx).Info("Released GPUSharingPolicy finalizer", "reason", reason, "remaining", len(remaining))
	if r.Recorder != nil {
		r.Recorder.Eventf(p, nil, kind, reason, "Delete", "%s", note)
	}
	return nil
}

// StillConfigured lists the GPUs a deleted policy still configures: listed under its name in a GPUNode's
// spec, or reported by the agent as applied from it.
func StillConfigured(policy string, nodes []NodeView) []GPURef {
	var out []GPURef
	for _, nv := range nodes {
		gn := nv.GPUNode
		for _, gpu := range gn.Status.GPUs {
			entry := resolve.FindDesired(gn.Spec.GPUs, gpu.UUID)
			if (entry != nil && entry.Policy == policy) || (gpu.Applied != nil && gpu.Applied.Policy == policy) {
				out = append(out, GPURef{Node: gn.Name, Index: gpu.Index})
			}
		}
	}
	sortRefs(out)
	return out
}
