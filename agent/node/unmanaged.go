package node

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// UnmanagedCheck is the unmanaged check's parts (agent/guard): which processes it names, what it does
// about them, and their series.
type UnmanagedCheck struct {
	Tracker  *guard.Unmanaged
	Enforcer *guard.Enforcer
	// Metrics may be nil.
	Metrics *guard.Metrics
}

// setUnmanaged fills status.gpus[].unmanaged and the Managed condition of each GPU the check covers
// (guard.KindOf) from the accounting's latest snapshot, and clears them on the others; prev is the
// status published before, kept where a GPU was not read.
func (r *Reconciler) setUnmanaged(sc *scope, gpus []v1alpha1.GPUStatus, prev []v1alpha1.GPUStatus) {
	kinds := map[string]guard.Kind{}
	for i := range gpus {
		g := &gpus[i]
		k := guard.KindOf(g.Applied)
		if r.Unmanaged == nil || r.Usage == nil || k == guard.KindNone {
			g.Unmanaged = nil
			meta.RemoveStatusCondition(&g.Conditions, v1alpha1.ConditionManaged)
			if g.Applied != nil {
				g.Applied.UnmanagedProcesses = ""
			}
			continue
		}
		if g.Applied.UnmanagedProcesses == "" {
			g.Applied.UnmanagedProcesses = v1alpha1.UnmanagedReport
		}
		kinds[g.UUID] = k
	}
	if r.Unmanaged == nil || r.Usage == nil {
		return
	}
	verdicts := r.Unmanaged.Tracker.Judge(r.Usage.Latest(), kinds)
	prevByUUID := map[string]*v1alpha1.GPUStatus{}
	for i := range prev {
		prevByUUID[prev[i].UUID] = &prev[i]
	}
	for i := range gpus {
		g := &gpus[i]
		v, ok := verdicts[g.UUID]
		if !ok {
			continue
		}
		var old *v1alpha1.GPUUnmanaged
		var conds []metav1.Condition
		if p := prevByUUID[g.UUID]; p != nil {
			old, conds = p.Unmanaged, p.Conditions
		}
		g.Unmanaged = guard.Status(v, old)
		guard.SetManaged(g, v, g.Applied.UnmanagedProcesses, conds)
		sc.unmanaged = append(sc.unmanaged, guard.GPU{UUID: g.UUID, Index: g.Index, Action: g.Applied.UnmanagedProcesses, Verdict: v})
	}
	r.Unmanaged.Metrics.Record(r.NodeName, verdicts)
}

// guardUnmanaged is the pass's phase that warns about and, where the GPU's action is Evict, evicts the
// pods whose processes the check named; it runs after the status is computed.
func (r *Reconciler) guardUnmanaged(ctx context.Context, sc *scope) {
	if r.Unmanaged == nil || r.Unmanaged.Enforcer == nil {
		return
	}
	r.Unmanaged.Enforcer.Enforce(ctx, sc.unmanaged)
}
