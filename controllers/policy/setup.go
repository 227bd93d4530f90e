package policy

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
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
// policy; the work queue folds a burst of them into one pass per policy.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	all := handler.EnqueueRequestsFromMapFunc(r.everyPolicy)
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1.GPUSharingPolicy{}, builder.WithPredicates(predicates.PolicySpecOrDeletion())).
		Watches(&v1.GPUSharingPolicy{}, all, builder.WithPredicates(predicates.PolicySpecOrDeletion())).
		Watches(&v1.GPUNode{}, all).
		WatchesMetadata(&corev1.Node{}, all, builder.WithPredicates(predicates.NodeLabelsOrLifecycle())).
		WithOptions(opts).
		Complete(r)
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

func nodeMetaList() *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	return l
}
