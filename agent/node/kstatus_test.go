package node

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestKstatusConditionsSummarizeTheNode(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg}
	}
	ready := cond(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonInventoryPublished, "1 GPUs")
	healthy := cond(v1alpha1.ConditionHealthy, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, "NVML answers")
	gpu := func(conds ...metav1.Condition) v1alpha1.GPUStatus {
		return v1alpha1.GPUStatus{UUID: "GPU-0", Index: 0, Conditions: conds}
	}
	tests := []struct {
		name                 string
		st                   v1alpha1.GPUNodeStatus
		stalled, reconciling metav1.ConditionStatus
		reason, message      string
	}{
		{"applied is neither", v1alpha1.GPUNodeStatus{
			Conditions: []metav1.Condition{ready, cond(v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, "1 of 1")},
			GPUs:       []v1alpha1.GPUStatus{gpu(cond(v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, "MPS x4 is in force"), healthy)},
		}, metav1.ConditionFalse, metav1.ConditionFalse, v1alpha1.ReasonAsDesired, "every listed GPU"},
		{"a drain in progress is reconciling", v1alpha1.GPUNodeStatus{
			Conditions: []metav1.Condition{ready, cond(v1alpha1.ConditionApplied, metav1.ConditionFalse, v1alpha1.ReasonDraining, "GPU 0: Draining: waiting")},
			GPUs:       []v1alpha1.GPUStatus{gpu(cond(v1alpha1.ConditionApplied, metav1.ConditionFalse, v1alpha1.ReasonDraining, "waiting"), healthy)},
		}, metav1.ConditionFalse, metav1.ConditionTrue, v1alpha1.ReasonDraining, "GPU 0: Draining: waiting"},
		{"a drain that timed out is stalled", v1alpha1.GPUNodeStatus{
			Conditions: []metav1.Condition{ready, cond(v1alpha1.ConditionApplied, metav1.ConditionFalse, v1alpha1.ReasonDrainTimedOut, "GPU 0: DrainTimedOut: pods")},
			GPUs:       []v1alpha1.GPUStatus{gpu(cond(v1alpha1.ConditionApplied, metav1.ConditionFalse, v1alpha1.ReasonDrainTimedOut, "pods default/a still use the GPU"), healthy)},
		}, metav1.ConditionTrue, metav1.ConditionFalse, v1alpha1.ReasonDrainTimedOut, "GPU 0: pods default/a still use the GPU"},
		{"an unhealthy GPU is stalled although applied", v1alpha1.GPUNodeStatus{
			Conditions: []metav1.Condition{ready, cond(v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, "1 of 1")},
			GPUs: []v1alpha1.GPUStatus{gpu(cond(v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, "in force"),
				cond(v1alpha1.ConditionHealthy, metav1.ConditionFalse, v1alpha1.ReasonXidError, "Xid 79"))},
		}, metav1.ConditionTrue, metav1.ConditionFalse, v1alpha1.ReasonXidError, "GPU 0: Xid 79"},
		{"NVML that cannot be read is stalled", v1alpha1.GPUNodeStatus{
			Conditions: []metav1.Condition{cond(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNVMLUnavailable, "no libnvidia-ml"),
				cond(v1alpha1.ConditionApplied, metav1.ConditionFalse, v1alpha1.ReasonNVMLUnavailable, "the GPUs cannot be read")},
		}, metav1.ConditionTrue, metav1.ConditionFalse, v1alpha1.ReasonNVMLUnavailable, "no libnvidia-ml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setKstatusConditions(&tt.st)
			s := meta.FindStatusCondition(tt.st.Conditions, v1alpha1.ConditionStalled)
			r := meta.FindStatusCondition(tt.st.Conditions, v1alpha1.ConditionReconciling)
			if s == nil || r == nil {
				t.Fatalf("conditions %+v lack Stalled or Reconciling", tt.st.Conditions)
			}
			if s.Status != tt.stalled || r.Status != tt.reconciling {
				t.Errorf("Stalled %s, Reconciling %s; want %s, %s", s.Status, r.Status, tt.stalled, tt.reconciling)
			}
			decisive := r
			if s.Status == metav1.ConditionTrue {
				decisive = s
			}
			if decisive.Reason != tt.reason || decisive.Message[:min(len(decisive.Message), len(tt.message))] != tt.message {
				t.Errorf("decisive condition %s %q, want %s starting %q", decisive.Reason, decisive.Message, tt.reason, tt.message)
			}
		})
	}
}
