package rightsizing

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// pending is a status to write, taken out of the lock.
type pending struct {
	key    types.NamespacedName
	t      target
	status v1.GPUShareRecommendationStatus
	exists bool
}

// flush writes the recommendations whose status a reader would see change, and the histories not
// checkpointed for CheckpointInterval.
func (r *Rightsizer) flush(ctx context.Context) error {
	now := r.clock().Now()
	var errs []error
	var todo []pending
	type snap struct {
		key types.NamespacedName
		e   *entry
	}
	r.mu.Lock()
	var keys []snap
	for key, e := range r.entries {
		if e.changed {
			keys = append(keys, snap{key, e})
		} else if now.Sub(e.lastSeen) > e.w.Config().PeakWindow {
			// No pod of it for a day: its history is in its object, loaded again if one comes back.
			delete(r.entries, key)
		}
	}
	r.mu.Unlock()
	for _, k := range keys {
		mode, b, err := r.modeAndBounds(ctx, k.e.t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		e := k.e
		in := statusInput{t: e.t, w: e.w, claimMemory: e.claimMemory, step: e.step, minMemory: e.minMemory,
			overClaims: e.overClaims, mode: mode, bounds: b, now: now}
		if e.written != nil {
			in.prev = e.written.Conditions
		}
		st := statusFor(in)
		if visiblyDiffers(&st, e.written) || now.Sub(e.lastWrite) >= r.CheckpointInterval {
			todo = append(todo, pending{key: k.key, t: e.t, status: st, exists: e.written != nil})
		}
		r.mu.Unlock()
	}
	for _, p := range todo {
		if err := r.write(ctx, p); err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		if e := r.entries[p.key]; e != nil {
			st := p.status
			e.written, e.lastWrite, e.changed = &st, now, false
		}
		r.mu.Unlock()
	}
	r.recordMetrics(now)
	return errors.Join(errs...)
}

// modeAndBounds reads the mode in force and the namespace's bounds for t.
func (r *Rightsizer) modeAndBounds(ctx context.Context, t target) (v1.RightsizingMode, bounds, error) {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, types.NamespacedName{Name: t.Namespace}, &ns); err != nil {
		return "", bounds{}, fmt.Errorf("reading Namespace %s: %w", t.Namespace, err)
	}
	w, err := r.workload(ctx, t)
	if err != nil {
		return "", bounds{}, err
	}
	var wa map[string]string
	if w != nil {
		wa = w.Annotations
	}
	return modeOf(wa, ns.Labels, ns.Annotations), boundsOf(ns.Annotations), nil
}

// workload is the workload's metadata, nil where it is gone.
func (r *Rightsizer) workload(ctx context.Context, t target) (*metav1.PartialObjectMetadata, error) {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(kinds[string(t.Workload.Kind)])
	var reader client.Reader = r.Client
	if t.Workload.Kind == v1.WorkloadPod || t.Workload.Kind == v1.WorkloadReplicaSet || t.Workload.Kind == v1.WorkloadJob {
		// Not cached: a cache of every pod, ReplicaSet or Job of the cluster costs more than a read.
		reader = r.APIReader
	}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Workload.Name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading %s %s/%s: %w", t.Workload.Kind, t.Namespace, t.Workload.Name, err)
	}
	return m, nil
}

// write creates the recommendation where it does not exist and writes its status.
func (r *Rightsizer) write(ctx context.Context, p pending) error {
	log := ctrl.LoggerFrom(ctx)
	var obj v1.GPUShareRecommendation
	err := r.Client.Get(ctx, p.key, &obj)
	switch {
	case apierrors.IsNotFound(err):
		obj = v1.GPUShareRecommendation{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.key.Namespace, Name: p.key.Name},
			Spec:       v1.GPUShareRecommendationSpec{Workload: p.t.Workload, PodClaim: p.t.PodClaim, Request: p.t.Request},
		}
		// Owned by the workload, so the garbage collector deletes it with the workload.
		if w, werr := r.workload(ctx, p.t); werr == nil && w != nil {
			gvk := kinds[string(p.t.Workload.Kind)]
			obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: w.Name, UID: w.UID}}
		}
		if err := r.Client.Create(ctx, &obj); err != nil {
			return fmt.Errorf("creating GPUShareRecommendation %s: %w", p.key, err)
		}
		log.Info("Created GPUShareRecommendation", "gpushareRecommendation", p.key, "workload", p.t.Workload.Name, "kind", p.t.Workload.Kind)
	case err != nil:
		return fmt.Errorf("reading GPUShareRecommendation %s: %w", p.key, err)
	}
	obj.Status = p.status
	if err := r.Client.Status().Update(ctx, &obj); err != nil {
		return fmt.Errorf("writing the status of GPUShareRecommendation %s: %w", p.key, err)
	}
	return nil
}

// expire is how long a claim counts as a share now after it was last seen.
func (r *Rightsizer) expire() time.Duration { return 3 * r.SampleInterval }
