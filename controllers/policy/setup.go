package policy

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/predicates"
)

// ControllerName names the status reconciler in logs and in controller-runtime's metrics.
const ControllerName = "policy-status"

// SetupWithManager wires the status reconciler. A policy's standing depends on every other policy
// (priority, conflicts), every GPUNode and every Node's labels, so each of those events re-runs every
// policy. A node event marks that node dirty in the tally, so the pass re-reads only the nodes that
// changed; the events are also folded: each queues the policies debounce later, and the queue keeps
// one entry per policy however many nodes change meanwhile.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options, debounce time.Duration) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1.GPUSharingPolicy{}, builder.WithPredicates(predicates.PolicySpecOrDeletion())).
		Watches(&v1.GPUSharingPolicy{}, handler.EnqueueRequestsFromMapFunc(r.everyPolicy), builder.WithPredicates(predicates.PolicySpecOrDeletion())).
		Watches(&v1.GPUNode{}, r.nodeChanged(debounce)).
		WatchesMetadata(&corev1.Node{}, r.nodeChanged(debounce), builder.WithPredicates(predicates.NodeLabelsOrLifecycle())).
		WithOptions(opts).
		Complete(r)
}

// nodeChanged marks the node of a Node or GPUNode event dirty in the tally (the next pass re-reads it)
// and queues every policy d later.
func (r *Reconciler) nodeChanged(d time.Duration) handler.EventHandler {
	add := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if o != nil {
			r.tallyOf().MarkDirty(o.GetName())
		}
		for _, req := range r.everyPolicy(ctx, nil) {
			q.AddAfter(req, d)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.ObjectNew, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
	}
}

func (r *Reconciler) everyPolicy(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1.GPUSharingPolicyList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "Listing GPUSharingPolicies for a change")
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}}
	}
	return reqs
}

func nodeMeta() *metav1.PartialObjectMetadata {
	n := &metav1.PartialObjectMetadata{}
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return n
}

func nodeMetaList() *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	return l
}
