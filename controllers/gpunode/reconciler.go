// Package gpunode is the resolver: keyed per node, it turns every GPUSharingPolicy, the Node's labels and
// the agent's inventory (GPUNode.status) into the GPUNode's spec, admits disruptive changes within each
// policy's rollout budget, and deletes GPUNodes whose Node is gone.
package gpunode

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// +kubebuilder:rbac:groups=gpusharing.io,resources=gpunodes,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpusharingpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Reconciler resolves one node's GPUs at a time.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads the API server directly; it confirms a Node is really gone before its GPUNode is
	// deleted, so a cache that has not caught up never costs a node its configuration.
	APIReader client.Reader
	// Clock decides when admission reservations expire; nil means the real clock.
	Clock clock.PassiveClock

	rollout *rollout
	echoes  *echoes
}

// scope is what one pass learns and decides about one node, filled phase by phase.
type scope struct {
	gpuNode *v1.GPUNode
	labels  map[string]string
	// policies are the candidate policies in precedence order; byName finds them by name.
	policies []resolve.Compiled
	byName   map[string]resolve.Compiled
	wishes   []resolve.Wish
	admitted map[string]bool
	// reserved lists the policies this pass reserved a rollout slot for (the node was not in flight).
	reserved []string
	// release runs when the pass ends: it drops reservations the pass took but did not write.
	release func()
	spec    []v1.GPUDesired
	waiting []string
}

// Reconcile resolves the GPUNode named by req.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	gn := &v1.GPUNode{}
	if err := r.Client.Get(ctx, req.NamespacedName, gn); err != nil {
		if apierrors.IsNotFound(err) {
			r.rollout.forget(req.Name)
			r.echoes.forget(req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting GPUNode: %w", err)
	}
	if !gn.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	s := &scope{gpuNode: gn, release: func() {}}
	defer func() { s.release() }()

	if err := r.loadNode(ctx, s); err != nil {
		if errors.Is(err, errNodeGone) {
			r.rollout.forget(gn.Name)
			r.echoes.forget(gn.Name)
			return ctrl.Result{}, r.deleteOrphan(ctx, gn)
		}
		return ctrl.Result{}, err
	}
	if len(gn.Status.GPUs) == 0 {
		// No inventory yet: there is nothing to resolve a selector against, so no spec is written.
		return ctrl.Result{}, nil
	}
	phases := []func(context.Context, *scope) error{
		r.loadPolicies,
		r.plan,
		r.admit,
		r.writeSpec,
	}
	for _, phase := range phases {
		if err := phase(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.rollout.setWaiting(gn.Name, s.waiting)
	if len(s.waiting) > 0 {
		logf.FromContext(ctx).V(1).Info("GPUNode waits for rollout", "policies", s.waiting)
	}
	return ctrl.Result{}, nil
}
