// Package policy reports each GPUSharingPolicy's standing (matched, ready and failing GPUs, rollout
// progress, conflicts) aggregated from every GPUNode, and holds a deleted policy until its GPUs are back
// on the default sharing.
package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// +kubebuilder:rbac:groups=gpusharing.io,resources=gpusharingpolicies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpusharingpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpusharingpolicies/finalizers,verbs=update
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpunodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Finalizer holds a deleted policy until the GPUs it configured run the default sharing again.
const Finalizer = "gpusharing.io/restore-default"

// DefaultRestoreTimeout bounds how long a deleted policy waits for agents to confirm the default: long
// enough for a drain with the default 10m timeout plus the change, short enough that a dead node cannot
// hold a GitOps sync forever.
const DefaultRestoreTimeout = 15 * time.Minute

// Reconciler keeps one policy's status and finalizer.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// RestoreTimeout bounds the wait for agents after deletion; zero means DefaultRestoreTimeout.
	RestoreTimeout time.Duration
	// Clock is the time source for the deletion bound; nil means the real clock.
	Clock clock.PassiveClock
	// ProgressInterval spaces the status writes that only report progress (see progressWriteDelay);
	// zero writes every change at once.
	ProgressInterval time.Duration

	// lastWrite holds, per policy name, when its status was last written.
	lastWrite sync.Map

	// tally keeps every policy's counts from node events (see tallyOf).
	tally     *Tally
	tallyOnce sync.Once
}

// tallyOf returns the reconciler's tally, created on first use so the event handlers and the workers
// share one.
func (r *Reconciler) tallyOf() *Tally {
	r.tallyOnce.Do(func() { r.tally = NewTally() })
	return r.tally
}

// scope is what one pass learns and decides about one policy.
type scope struct {
	policy   *v1.GPUSharingPolicy
	original *v1.GPUSharingPolicy
	compiled []resolve.Compiled
	nodes    []NodeView
	summary  Summary
	// released is set once the finalizer is gone: the object may be deleted, so status is not written.
	released bool
	requeue  time.Duration
}

// Reconcile recomputes the policy named by req.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	p := &v1.GPUSharingPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		if apierrors.IsNotFound(err) {
			forgetMetrics(req.Name)
			r.lastWrite.Delete(req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting GPUSharingPolicy: %w", err)
	}
	s := &scope{policy: p, original: p.DeepCopy()}
	defer func() {
		reterr = errors.Join(reterr, r.writeStatus(ctx, s, reterr == nil))
		if reterr == nil && s.requeue > 0 {
			// writeStatus may have held back a progress write: come back to write it.
			res.RequeueAfter = s.requeue
		}
	}()

	// A live policy's counts come from the tally, which re-reads only the nodes that changed; only a
	// deleting policy, rare and bounded in time, reads every GPUNode for the GPUs it still configures.
	phases := []func(context.Context, *scope) error{r.ensureFinalizer, r.loadPolicies, r.summarize}
	if !p.DeletionTimestamp.IsZero() {
		phases = []func(context.Context, *scope) error{r.loadNodes, r.restoreDefault}
	}
	for _, phase := range phases {
		if err := phase(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		if s.released {
			break
		}
	}
	return ctrl.Result{RequeueAfter: s.requeue}, nil
}

func (r *Reconciler) ensureFinalizer(ctx context.Context, s *scope) error {
	if controllerutil.ContainsFinalizer(s.policy, Finalizer) {
		return nil
	}
	patch := client.MergeFrom(s.policy.DeepCopy())
	controllerutil.AddFinalizer(s.policy, Finalizer)
	if err := r.Client.Patch(ctx, s.policy, patch); err != nil {
		return fmt.Errorf("adding finalizer: %w", err)
	}
	s.original = s.policy.DeepCopy()
	return nil
}

func (r *Reconciler) loadPolicies(ctx context.Context, s *scope) error {
	var list v1.GPUSharingPolicyList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing GPUSharingPolicies: %w", err)
	}
	ps := make([]*v1.GPUSharingPolicy, len(list.Items))
	for i := range list.Items {
		ps[i] = &list.Items[i]
	}
	s.compiled = resolve.Compile(ps)
	return nil
}

// loadNodes joins every GPUNode with its Node's labels, straight from the cache and without copies.
func (r *Reconciler) loadNodes(ctx context.Context, s *scope) error {
	var gns v1.GPUNodeList
	if err := r.Client.List(ctx, &gns, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing GPUNodes: %w", err)
	}
	nodes := nodeMetaList()
	if err := r.Client.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	labels := make(map[string]map[string]string, len(nodes.Items))
	for i := range nodes.Items {
		labels[nodes.Items[i].Name] = nodes.Items[i].Labels
	}
	s.nodes = make([]NodeView, 0, len(gns.Items))
	for i := range gns.Items {
		l, ok := labels[gns.Items[i].Name]
		if !ok {
			// The resolver deletes a GPUNode whose Node is gone; until then it configures nothing.
			continue
		}
		s.nodes = append(s.nodes, NodeView{GPUNode: &gns.Items[i], Labels: l})
	}
	return nil
}

func (r *Reconciler) summarize(ctx context.Context, s *scope) error {
	sum, err := r.tallyOf().Summary(ctx, r.Client, s.compiled, s.policy)
	if err != nil {
		return err
	}
	s.summary = sum
	recordMetrics(s.policy.Name, s.summary)
	SetStatus(s.policy, s.summary, resolve.MaxUnavailable(s.policy.Spec.Rollout, s.summary.SelectedNodes))
	return nil
}

// writeStatus is the pass's one status write: observedGeneration only after a clean pass, nothing when
// the status did not change, and an event for every condition that changed status or reason.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope, clean bool) error {
	if s.released {
		return nil
	}
	if clean {
		s.policy.Status.ObservedGeneration = s.policy.Generation
	}
	if equality.Semantic.DeepEqual(s.original.Status, s.policy.Status) {
		return nil
	}
	var last time.Time
	if v, ok := r.lastWrite.Load(s.policy.Name); ok {
		last = v.(time.Time)
	}
	if wait := progressWriteDelay(&s.original.Status, &s.policy.Status, last, r.now(), r.ProgressInterval); wait > 0 {
		if s.requeue == 0 || wait < s.requeue {
			s.requeue = wait
		}
		return nil
	}
	if err := r.Client.Status().Patch(ctx, s.policy, client.MergeFrom(s.original)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing GPUSharingPolicy status: %w", err)
	}
	r.lastWrite.Store(s.policy.Name, r.now())
	for _, t := range Transitions(s.original.Status.Conditions, s.policy.Status.Conditions) {
		r.event(s.policy, t.Warning, t.Condition.Reason, t.Condition.Type+": "+t.Condition.Message)
	}
	return nil
}

func (r *Reconciler) event(p *v1.GPUSharingPolicy, warning bool, reason, note string) {
	if r.Recorder == nil {
		return
	}
	kind := corev1.EventTypeNormal
	if warning {
		kind = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(p, nil, kind, reason, "Reconcile", "%s", note)
}

func (r *Reconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}
