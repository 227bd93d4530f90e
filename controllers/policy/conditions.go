package policy

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// maxCauses is how many concrete causes a condition message names before it says "and N more".
const maxCauses = 3

// SetStatus recomputes the policy's counts and its four conditions from the summary.
func SetStatus(p *v1.GPUSharingPolicy, s Summary, maxUnavailable int) {
	s = s.withCounts()
	p.Status.MatchedNodes = int32(s.MatchedNodes)
	p.Status.MatchedGPUs = int32(s.MatchedGPUs)
	p.Status.ReadyGPUs = int32(s.ReadyGPUs)
	SetReadyCondition(p, s)
	SetProgressingCondition(p, s, maxUnavailable)
	SetDegradedCondition(p, s)
	SetConflictedCondition(p, s)
	SetKstatusConditions(p)
}

// SetKstatusConditions summarizes Degraded and Progressing as kstatus's Stalled and Reconciling, so Flux
// and other kstatus readers report Failed for a hardware rejection or a drain that timed out, InProgress
// while the rollout runs, and Current otherwise. Stalled wins: a rollout with one GPU refused cannot
// finish, however many others still apply.
func SetKstatusConditions(p *v1.GPUSharingPolicy) {
	if d := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionDegraded); d != nil && d.Status == metav1.ConditionTrue {
		set(p, v1.ConditionStalled, metav1.ConditionTrue, d.Reason, d.Message)
		set(p, v1.ConditionReconciling, metav1.ConditionFalse, d.Reason, "stalled: "+d.Message)
		return
	}
	set(p, v1.ConditionStalled, metav1.ConditionFalse, v1.ReasonAsDesired, "no GPU reports a failure")
	if pr := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionProgressing); pr != nil && pr.Status == metav1.ConditionTrue {
		set(p, v1.ConditionReconciling, metav1.ConditionTrue, pr.Reason, pr.Message)
		return
	}
	set(p, v1.ConditionReconciling, metav1.ConditionFalse, v1.ReasonRolledOut, "nothing left to roll out")
}

// SetReadyCondition: True when the policy wins GPUs and every one of them reports its sharing applied;
// otherwise False with the most pressing cause first: no GPUs, hardware rejections, rollout, applying.
func SetReadyCondition(p *v1.GPUSharingPolicy, s Summary) {
	s = s.withCounts()
	status, reason, msg := metav1.ConditionFalse, "", ""
	switch {
	case s.MatchedGPUs == 0:
		reason, msg = v1.ReasonNoMatchingGPUs, "no GPU matches the policy"
		if s.SelectorErr != nil {
			msg = fmt.Sprintf("no GPU matches the policy: %v", s.SelectorErr)
		}
	case s.FailureCount > 0:
		reason, msg = v1.ReasonHardwareRejected, fmt.Sprintf("%d of %d GPUs applied; %s", s.ReadyGPUs, s.MatchedGPUs, failures(s.Failures, s.FailureCount))
	case s.WaitingCount > 0:
		reason, msg = v1.ReasonWaitingForRollout, fmt.Sprintf("%d of %d GPUs applied; %d nodes wait for their turn", s.ReadyGPUs, s.MatchedGPUs, s.WaitingCount)
	case s.ReadyGPUs < s.MatchedGPUs:
		reason, msg = v1.ReasonApplying, fmt.Sprintf("%d of %d GPUs applied; applying on %s", s.ReadyGPUs, s.MatchedGPUs, refs(s.Applying, s.ApplyingCount))
	default:
		status, reason, msg = metav1.ConditionTrue, v1.ReasonAsDesired, fmt.Sprintf("all %s on %s run the declared sharing", count(s.MatchedGPUs, "GPU"), count(s.MatchedNodes, "node"))
	}
	set(p, v1.ConditionReady, status, reason, msg)
}

// SetProgressingCondition: True while disruptive changes wait for the rollout budget (WaitingForRollout)
// or written changes are not yet applied (Applying); False once nothing is left to roll out.
func SetProgressingCondition(p *v1.GPUSharingPolicy, s Summary, maxUnavailable int) {
	s = s.withCounts()
	switch {
	case s.WaitingCount > 0:
		set(p, v1.ConditionProgressing, metav1.ConditionTrue, v1.ReasonWaitingForRollout,
			fmt.Sprintf("%d nodes wait for their turn, %d in flight (maxUnavailable %d): %s",
				s.WaitingCount, s.InFlightCount, maxUnavailable, names(s.WaitingNodes, s.WaitingCount)))
	case s.ApplyingCount > 0:
		set(p, v1.ConditionProgressing, metav1.ConditionTrue, v1.ReasonApplying,
			fmt.Sprintf("%d GPUs being applied: %s", s.ApplyingCount, refs(s.Applying, s.ApplyingCount)))
	default:
		set(p, v1.ConditionProgressing, metav1.ConditionFalse, v1.ReasonRolledOut, "nothing left to roll out")
	}
}

// SetDegradedCondition: True when an agent reports a GPU it cannot configure as declared or unhealthy;
// the message carries the agent's own words for the first GPUs.
func SetDegradedCondition(p *v1.GPUSharingPolicy, s Summary) {
	s = s.withCounts()
	if s.FailureCount > 0 {
		set(p, v1.ConditionDegraded, metav1.ConditionTrue, v1.ReasonHardwareRejected, failures(s.Failures, s.FailureCount))
		return
	}
	set(p, v1.ConditionDegraded, metav1.ConditionFalse, v1.ReasonAsDesired, "no GPU reports a failure")
}

// SetConflictedCondition: True when policies of equal priority select some of the same GPUs; the message
// names each other policy, how many GPUs are contested and which policy wins them.
func SetConflictedCondition(p *v1.GPUSharingPolicy, s Summary) {
	if len(s.Conflicts) == 0 {
		set(p, v1.ConditionConflicted, metav1.ConditionFalse, v1.ReasonNoConflict, "no policy of equal priority selects the same GPUs")
		return
	}
	parts := make([]string, len(s.Conflicts))
	for i, c := range s.Conflicts {
		parts[i] = fmt.Sprintf("policy %s has the same priority %d and selects %d of the same GPUs, which %s wins (the older policy, then the smaller name)",
			c.Other, p.Spec.Priority, c.GPUs, c.Winner)
	}
	set(p, v1.ConditionConflicted, metav1.ConditionTrue, v1.ReasonEqualPriority, strings.Join(parts, "; "))
}

// SetRestoringConditions reports a deleting policy that waits for its GPUs to return to the default.
func SetRestoringConditions(p *v1.GPUSharingPolicy, remaining []GPURef, deadline metav1.Time) {
	msg := fmt.Sprintf("deleting: %d GPUs do not yet run the default (Exclusive): %s; the finalizer is released at %s at the latest",
		len(remaining), refs(remaining, len(remaining)), deadline.UTC().Format("15:04:05Z"))
	set(p, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonRestoringDefault, msg)
	set(p, v1.ConditionProgressing, metav1.ConditionTrue, v1.ReasonRestoringDefault, msg)
	SetKstatusConditions(p)
}

func set(p *v1.GPUSharingPolicy, t string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: p.Generation,
	})
}

func failures(fs []Failure, total int) string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return list(out, total, "; ")
}

func refs(rs []GPURef, total int) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return list(out, total, ", ")
}

func names(ns []string, total int) string { return list(ns, total, ", ") }

// list joins the first maxCauses items and says how many more of total there are.
func list(items []string, total int, sep string) string {
	if len(items) > maxCauses {
		items = items[:maxCauses]
	}
	if total <= len(items) {
		return strings.Join(items, sep)
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items, sep), total-len(items))
}

// Transition is a condition that changed status or reason in this pass: it gets an event.
type Transition struct {
	Condition metav1.Condition
	Warning   bool
}

// Transitions compares conditions before and after a pass. Only a changed status or reason is a
// transition; a message that merely counts progress is not, so events stay rare.
func Transitions(before, after []metav1.Condition) []Transition {
	var out []Transition
	for _, c := range after {
		if c.Type == v1.ConditionReconciling || c.Type == v1.ConditionStalled {
			// Summaries of Progressing and Degraded, whose own transitions already make the event.
			continue
		}
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		out = append(out, Transition{Condition: c, Warning: warning(c)})
	}
	return out
}

// warning marks the transitions an admin must act on.
func warning(c metav1.Condition) bool {
	switch c.Type {
	case v1.ConditionDegraded, v1.ConditionConflicted:
		return c.Status == metav1.ConditionTrue
	case v1.ConditionReady:
		return c.Reason == v1.ReasonHardwareRejected
	}
	return false
}

// count writes "1 node" or "3 nodes".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
