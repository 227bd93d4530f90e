package gpunode

import (
	"context"

	corev1 "k8s.io/api/core/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/predicates"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// ControllerName names the resolver in logs and in controller-runtime's metrics.
const ControllerName = "gpunode-resolver"

// SetupWithManager wires the resolver: GPUNodes are its primary objects (except the echo of its own spec
// write, see echoes, and an agent's plain ack, see isPlainAck); a Node's label change or deletion
// re-runs that node; a policy's spec change or deletion re-runs every node; a node leaving a policy's
// in-flight set wakes the next nodes waiting on that policy. index.Setup must have run.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	r.rollout = newRollout(r.Clock)
	r.echoes = newEchoes()
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1.GPUNode{}, builder.WithPredicates(r.echoes.notEcho(), r.notPlainAck())).
		Watches(&v1.GPUNode{}, r.slotFreed()).
		WatchesMetadata(&corev1.Node{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(predicates.NodeLabelsOrLifecycle())).
		Watches(&v1.GPUSharingPolicy{}, handler.EnqueueRequestsFromMapFunc(r.everyGPUNode), builder.WithPredicates(predicates.PolicySpecOrDeletion())).
		WatchesRawSource(source.Channel(r.rollout.nudges, &handler.EnqueueRequestForObject{})).
		WithOptions(opts).
		Complete(r)
}

// slotFreed hands admission reservations over to the cache (the handler runs after the cache holds the
// new object) and wakes the next waiting nodes of every policy a node stops having in flight (applied,
// rejected by the hardware, or the GPUNode deleted).
func (r *Reconciler) slotFreed() handler.EventHandler {
	return handler.Funcs{
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			oldN, ok1 := e.ObjectOld.(*v1.GPUNode)
			newN, ok2 := e.ObjectNew.(*v1.GPUNode)
			if !ok1 || !ok2 {
				return
			}
			r.rollout.observed(newN.Name, newN.Generation)
			r.rollout.wake(q, subtract(resolve.InFlightPolicies(oldN), resolve.InFlightPolicies(newN)))
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if n, ok := e.Object.(*v1.GPUNode); ok {
				r.rollout.unreserve(n.Name, r.rollout.policiesReserving(n.Name))
				r.rollout.wake(q, resolve.InFlightPolicies(n))
			}
		},
	}
}

func subtract(a, b []string) []string {
	var out []string
	for _, x := range a {
		found := false
		for _, y := range b {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			out = append(out, x)
		}
	}
	return out
}

// everyGPUNode maps a policy change to every GPUNode: any node may gain or lose the policy's GPUs.
func (r *Reconciler) everyGPUNode(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1.GPUNodeList
	if err := r.Client.List(ctx, &list, unsafeNoCopy); err != nil {
		logf.FromContext(ctx).Error(err, "Listing GPUNodes for a GPUSharingPolicy change")
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}}
	}
	return reqs
}
