package node

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// setKstatusConditions summarizes the node's Ready and Applied conditions and its GPUs' Healthy and
// Applied conditions as kstatus's Stalled and Reconciling (see v1alpha1.ConditionStalled), so Flux and
// other kstatus readers tell a GPUNode that is still converging (InProgress) from one that cannot
// converge until someone acts (Failed). It runs after setReady and setApplied.
func setKstatusConditions(st *v1alpha1.GPUNodeStatus) {
	reason, msg, stalled := stalledBy(st)
	if stalled {
		setCondition(&st.Conditions, v1alpha1.ConditionStalled, metav1.ConditionTrue, reason, msg)
		setCondition(&st.Conditions, v1alpha1.ConditionReconciling, metav1.ConditionFalse, reason, "stalled: "+msg)
		return
	}
	setCondition(&st.Conditions, v1alpha1.ConditionStalled, metav1.ConditionFalse, v1alpha1.ReasonAsDesired, "no GPU reports a failure")
	if a := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionApplied); a != nil && a.Status != metav1.ConditionTrue {
		setCondition(&st.Conditions, v1alpha1.ConditionReconciling, metav1.ConditionTrue, a.Reason, a.Message)
		return
	}
	setCondition(&st.Conditions, v1alpha1.ConditionReconciling, metav1.ConditionFalse, v1alpha1.ReasonAsDesired, "every listed GPU runs its desired sharing")
}

// stalledBy is the first reason the node cannot converge: NVML cannot be read, a GPU is unhealthy, or
// a GPU refused its desired sharing (v1alpha1.IsHardwareRejection).
func stalledBy(st *v1alpha1.GPUNodeStatus) (reason, msg string, stalled bool) {
	if r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); r != nil && r.Status == metav1.ConditionFalse {
		return r.Reason, r.Message, true
	}
	for _, g := range st.GPUs {
		if h := meta.FindStatusCondition(g.Conditions, v1alpha1.ConditionHealthy); h != nil && h.Status == metav1.ConditionFalse {
			return h.Reason, fmt.Sprintf("GPU %d: %s", g.Index, h.Message), true
		}
	}
	for _, g := range st.GPUs {
		a := meta.FindStatusCondition(g.Conditions, v1alpha1.ConditionApplied)
		if a != nil && a.Status == metav1.ConditionFalse && v1alpha1.IsHardwareRejection(a.Reason) {
			return a.Reason, fmt.Sprintf("GPU %d: %s", g.Index, a.Message), true
		}
	}
	return "", "", false
}
