package policy_test

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/policy"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

func failure(node string, index int32, msg string) policy.Failure {
	return policy.Failure{GPURef: policy.GPURef{Node: node, Index: index}, Reason: v1.ReasonLayoutDoesNotFit, Message: msg}
}

func TestSetStatusConditions(t *testing.T) {
	type want struct {
		status  metav1.ConditionStatus
		reason  string
		message string
	}
	tests := []struct {
		name    string
		summary policy.Summary
		want    map[string]want
	}{
		{
			name:    "is Ready when every GPU it wins is applied",
			summary: policy.Summary{MatchedNodes: 2, MatchedGPUs: 16, ReadyGPUs: 16},
			want: map[string]want{
				v1.ConditionReady:       {metav1.ConditionTrue, v1.ReasonAsDesired, "all 16 GPUs on 2 nodes"},
				v1.ConditionProgressing: {metav1.ConditionFalse, v1.ReasonRolledOut, ""},
				v1.ConditionDegraded:    {metav1.ConditionFalse, v1.ReasonAsDesired, ""},
				v1.ConditionConflicted:  {metav1.ConditionFalse, v1.ReasonNoConflict, ""},
				v1.ConditionReconciling: {metav1.ConditionFalse, v1.ReasonRolledOut, ""},
				v1.ConditionStalled:     {metav1.ConditionFalse, v1.ReasonAsDesired, ""},
			},
		},
		{
			name:    "is not Ready when it matches no GPU, and says why the selector failed",
			summary: policy.Summary{SelectorErr: errors.New("bad operator")},
			want: map[string]want{
				v1.ConditionReady: {metav1.ConditionFalse, v1.ReasonNoMatchingGPUs, "bad operator"},
			},
		},
		{
			name: "names the first hardware rejections in the agent's words and counts the rest",
			summary: policy.Summary{MatchedNodes: 3, MatchedGPUs: 8, ReadyGPUs: 4, Failures: []policy.Failure{
				failure("a-1", 0, "m0"), failure("a-2", 1, "m1"), failure("a-3", 2, "layout 3x3g.40gb does not fit NVIDIA H100 80GB HBM3"), failure("a-4", 0, "m3"),
			}},
			want: map[string]want{
				v1.ConditionReady:    {metav1.ConditionFalse, v1.ReasonHardwareRejected, "4 of 8 GPUs applied; node a-1 GPU 0: m0"},
				v1.ConditionDegraded: {metav1.ConditionTrue, v1.ReasonHardwareRejected, "node a-3 GPU 2: layout 3x3g.40gb does not fit NVIDIA H100 80GB HBM3 and 1 more"},
				// kstatus: Failed, not InProgress, although other GPUs may still be applying.
				v1.ConditionStalled:     {metav1.ConditionTrue, v1.ReasonHardwareRejected, "node a-3 GPU 2: layout 3x3g.40gb"},
				v1.ConditionReconciling: {metav1.ConditionFalse, v1.ReasonHardwareRejected, "stalled: "},
			},
		},
		{
			name:    "reports nodes waiting for the rollout budget",
			summary: policy.Summary{MatchedNodes: 6, MatchedGPUs: 6, ReadyGPUs: 1, WaitingNodes: []string{"n2", "n3", "n4", "n5"}, InFlightNodes: []string{"n1"}},
			want: map[string]want{
				v1.ConditionReady:       {metav1.ConditionFalse, v1.ReasonWaitingForRollout, "4 nodes wait"},
				v1.ConditionProgressing: {metav1.ConditionTrue, v1.ReasonWaitingForRollout, "4 nodes wait for their turn, 1 in flight (maxUnavailable 1): n2, n3, n4 and 1 more"},
				v1.ConditionReconciling: {metav1.ConditionTrue, v1.ReasonWaitingForRollout, "4 nodes wait for their turn"},
				v1.ConditionStalled:     {metav1.ConditionFalse, v1.ReasonAsDesired, ""},
			},
		},
		{
			name:    "reports GPUs being applied",
			summary: policy.Summary{MatchedNodes: 1, MatchedGPUs: 2, ReadyGPUs: 1, Applying: []policy.GPURef{{Node: "n1", Index: 1}}},
			want: map[string]want{
				v1.ConditionReady:       {metav1.ConditionFalse, v1.ReasonApplying, "1 of 2 GPUs applied; applying on node n1 GPU 1"},
				v1.ConditionProgressing: {metav1.ConditionTrue, v1.ReasonApplying, "node n1 GPU 1"},
				v1.ConditionReconciling: {metav1.ConditionTrue, v1.ReasonApplying, "node n1 GPU 1"},
			},
		},
		{
			name:    "names the other policy, the contested GPUs and the winner of a conflict",
			summary: policy.Summary{MatchedGPUs: 0, Conflicts: []policy.Conflict{{Other: "b", GPUs: 4, Winner: "b"}}},
			want: map[string]want{
				v1.ConditionConflicted: {metav1.ConditionTrue, v1.ReasonEqualPriority, "policy b has the same priority 7 and selects 4 of the same GPUs, which b wins"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := b.Policy("p", b.WithPriority(7), b.WithGeneration(3))
			policy.SetStatus(p, tt.summary, 1)
			for typ, w := range tt.want {
				c := meta.FindStatusCondition(p.Status.Conditions, typ)
				if c == nil {
					t.Fatalf("no %s condition", typ)
				}
				if c.Status != w.status || c.Reason != w.reason || !strings.Contains(c.Message, w.message) {
					t.Errorf("%s = %s/%s %q, want %s/%s containing %q", typ, c.Status, c.Reason, c.Message, w.status, w.reason, w.message)
				}
				if c.ObservedGeneration != 3 {
					t.Errorf("%s observedGeneration = %d, want 3", typ, c.ObservedGeneration)
				}
			}
		})
	}
}

func TestTransitionsAreOnlyStatusOrReasonChanges(t *testing.T) {
	before := []metav1.Condition{
		{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonApplying, Message: "1 of 8"},
		{Type: v1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: v1.ReasonAsDesired},
		{Type: v1.ConditionConflicted, Status: metav1.ConditionFalse, Reason: v1.ReasonNoConflict},
	}
	after := []metav1.Condition{
		{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonApplying, Message: "5 of 8"},
		{Type: v1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: v1.ReasonHardwareRejected},
		{Type: v1.ConditionConflicted, Status: metav1.ConditionFalse, Reason: v1.ReasonNoConflict},
		{Type: v1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: v1.ReasonApplying},
		// Summaries of Progressing and Degraded: their transitions would only repeat those events.
		{Type: v1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: v1.ReasonApplying},
		{Type: v1.ConditionStalled, Status: metav1.ConditionTrue, Reason: v1.ReasonHardwareRejected},
	}
	got := policy.Transitions(before, after)
	if len(got) != 2 {
		t.Fatalf("got %d transitions, want 2 (Degraded, new Progressing): %+v", len(got), got)
	}
	if got[0].Condition.Type != v1.ConditionDegraded || !got[0].Warning {
		t.Errorf("first transition = %+v, want a Degraded warning", got[0])
	}
	if got[1].Condition.Type != v1.ConditionProgressing || got[1].Warning {
		t.Errorf("second transition = %+v, want a normal Progressing", got[1])
	}
}
