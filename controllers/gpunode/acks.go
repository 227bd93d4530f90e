package gpunode

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// isPlainAck says whether an update is only the agent acknowledging the spec: the GPUs' inventory (what
// policies select on) is unchanged, only what the agent reports in force moved, every GPU the spec lists
// now reports its entry applied, and no entry is a return to the default (its ack removes the entry, so
// the resolver must run). A pass over such a node writes nothing: it would want exactly the spec in
// place. A node waiting for a rollout slot always runs. The slot its ack frees is handed on by
// slotFreed, which sees every event. Skipping these halves the resolver's reconciles during a rollout
// (one write and one ack a node).
func (r *Reconciler) isPlainAck(old, cur *v1.GPUNode) bool {
	// The same resourceVersion is a resync, the safety net for anything missed: it always runs.
	if old.ResourceVersion == cur.ResourceVersion || old.Generation != cur.Generation || len(cur.Spec.GPUs) == 0 ||
		!equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
		!equality.Semantic.DeepEqual(old.Annotations, cur.Annotations) ||
		!equality.Semantic.DeepEqual(old.Finalizers, cur.Finalizers) ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp) ||
		!sameInventory(old.Status.GPUs, cur.Status.GPUs) {
		return false
	}
	for i := range cur.Spec.GPUs {
		e := &cur.Spec.GPUs[i]
		if e.Policy == "" || resolve.StateOf(cur, e).Phase != resolve.PhaseApplied {
			return false
		}
	}
	return !r.rollout.isWaiting(cur.Name)
}

// sameInventory compares two reports GPU by GPU, leaving out what the agent changes when it applies a
// spec (applied sharing, conditions, processes, drain).
func sameInventory(a, b []v1.GPUStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := inventory(a[i]), inventory(b[i])
		if !equality.Semantic.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

func inventory(g v1.GPUStatus) v1.GPUStatus {
	g.Applied, g.Conditions, g.Processes, g.Drain = nil, nil, nil, nil
	return g
}

// notPlainAck is the predicate for the resolver's own GPUNode events.
func (r *Reconciler) notPlainAck() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(ev event.UpdateEvent) bool {
		old, ok1 := ev.ObjectOld.(*v1.GPUNode)
		cur, ok2 := ev.ObjectNew.(*v1.GPUNode)
		return !ok1 || !ok2 || !r.isPlainAck(old, cur)
	}}
}
