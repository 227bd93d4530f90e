package policy

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestProgressOnlyWritesWaitForTheIntervalAndTransitionsDoNot(t *testing.T) {
	cond := func(status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: v1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: 2}
	}
	applying := v1.GPUSharingPolicyStatus{ObservedGeneration: 2, MatchedGPUs: 80, ReadyGPUs: 10,
		Conditions: []metav1.Condition{cond(metav1.ConditionFalse, v1.ReasonApplying, "10 of 80 GPUs ready")}}
	more := *applying.DeepCopy()
	more.ReadyGPUs = 20
	more.Conditions[0].Message = "20 of 80 GPUs ready"
	ready := *applying.DeepCopy()
	ready.ReadyGPUs = 80
	ready.Conditions[0] = cond(metav1.ConditionTrue, v1.ReasonAsDesired, "")
	newGen := *more.DeepCopy()
	newGen.ObservedGeneration = 3

	last := time.Unix(1000, 0)
	for _, tc := range []struct {
		name     string
		now      v1.GPUSharingPolicyStatus
		last, at time.Time
		want     time.Duration
	}{
		{"more GPUs ready, 1s after the last write: waits the rest of the interval", more, last, last.Add(time.Second), 4 * time.Second},
		{"more GPUs ready, after the interval: writes now", more, last, last.Add(6 * time.Second), 0},
		{"Ready turns True: writes now", ready, last, last.Add(time.Second), 0},
		{"a new generation observed: writes now", newGen, last, last.Add(time.Second), 0},
		{"no write yet since the start: writes now", more, time.Time{}, last, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := progressWriteDelay(&applying, &tc.now, tc.last, tc.at, 5*time.Second); got != tc.want {
				t.Errorf("delay = %s, want %s", got, tc.want)
			}
		})
	}
	if got := progressWriteDelay(&applying, &more, last, last.Add(time.Second), 0); got != 0 {
		t.Errorf("delay with the interval off = %s, want 0", got)
	}
}
