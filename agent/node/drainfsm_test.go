package node

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

var (
	fsmNow = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	fsmA   = drainTarget{key: "a", target: "MPS x2", mode: v1alpha1.DrainWaitForIdle, timeout: time.Minute}
	fsmB   = drainTarget{key: "b", target: "MIG 1g.5gb x7", mode: v1alpha1.DrainEvict, timeout: time.Minute}
)

// passFor is a pass that wants t; disruptive and admitted unless the options say otherwise.
func passFor(t drainTarget, opts ...func(*observation)) observation {
	o := observation{kind: obsPass, now: fsmNow, want: t, disruptive: true, admitted: true, backoff: time.Minute, backoffMax: time.Hour}
	for _, f := range opts {
		f(&o)
	}
	return o
}

func notDisruptive(o *observation) { o.disruptive = false }
func notAdmitted(o *observation)   { o.admitted = false }
func at(d time.Duration) func(*observation) {
	return func(o *observation) { o.now = fsmNow.Add(d) }
}

func in(p drainPhase, t drainTarget) drainState { return drainState{phase: p, drainTarget: t, seq: 3} }

func backingOff(p drainPhase) drainState {
	s := in(p, fsmA)
	s.failures, s.retryAt, s.failure = 2, fsmNow.Add(time.Minute), outcome.Newf(v1alpha1.ReasonDrainTimedOut, "x")
	return s
}

// TestDrainTransitions pins every transition of the drain's state machine: from each phase, each kind
// of observation that moves it, and the actions the reconciler must take.
func TestDrainTransitions(t *testing.T) {
	tests := []struct {
		name  string
		from  drainState
		obs   observation
		phase drainPhase
		acts  []drainAction
	}{
		// Idle
		{"idle, not disruptive: converge directly", drainState{}, passFor(fsmA, notDisruptive), phaseIdle, []drainAction{actConverge}},
		{"idle, refused by Admit: converge reports the refusal, no pod evicted", drainState{}, passFor(fsmA, notAdmitted), phaseIdle, []drainAction{actConverge}},
		{"idle, disruptive: cordon", drainState{}, passFor(fsmA), phaseCordoned, []drainAction{actCordon}},
		{"idle ignores a stale drain end", drainState{}, observation{kind: obsDrainEnded, seq: 1}, phaseIdle, nil},
		{"idle ignores a stale apply result", drainState{}, observation{kind: obsApplied}, phaseIdle, nil},
		// Cordoned
		{"cordoned: start the drain", in(phaseCordoned, fsmA), passFor(fsmA), phaseDraining, []drainAction{actStartDrain}},
		{"cordoned, no longer disruptive: uncordon and converge", in(phaseCordoned, fsmA), passFor(fsmA, notDisruptive), phaseIdle, []drainAction{actUncordon, actConverge}},
		{"cordoned, new disruptive spec: stays hidden for the new drain", in(phaseCordoned, fsmA), passFor(fsmB), phaseCordoned, nil},
		// Draining
		{"draining: wait", in(phaseDraining, fsmA), passFor(fsmA), phaseDraining, nil},
		{"draining, progress of this run", in(phaseDraining, fsmA), observation{kind: obsProgress, seq: 3}, phaseDraining, nil},
		{"draining, ended with no pod left", in(phaseDraining, fsmA), observation{kind: obsDrainEnded, seq: 3}, phaseDrained, nil},
		{"draining, timed out: advertised again", in(phaseDraining, fsmA), observation{kind: obsDrainEnded, seq: 3, err: vacate.ErrTimeout}, phaseFailed, []drainAction{actUncordon}},
		{"draining, failed: advertised again", in(phaseDraining, fsmA), observation{kind: obsDrainEnded, seq: 3, err: vacate.ErrEvictionFailed}, phaseFailed, []drainAction{actUncordon}},
		{"draining ignores the end of an earlier run", in(phaseDraining, fsmA), observation{kind: obsDrainEnded, seq: 2, err: vacate.ErrTimeout}, phaseDraining, nil},
		{"draining, spec no longer disruptive: stop, uncordon, converge", in(phaseDraining, fsmA), passFor(fsmA, notDisruptive), phaseIdle, []drainAction{actStopDrain, actUncordon, actConverge}},
		{"draining, new spec refused: stop, uncordon, converge reports it", in(phaseDraining, fsmA), passFor(fsmB, notAdmitted), phaseIdle, []drainAction{actStopDrain, actUncordon, actConverge}},
		{"draining, new disruptive spec: stop and drain again, still hidden", in(phaseDraining, fsmA), passFor(fsmB), phaseCordoned, []drainAction{actStopDrain}},
		// Drained
		{"drained: apply", in(phaseDrained, fsmA), passFor(fsmA), phaseDrained, []drainAction{actConverge}},
		{"drained, applied: advertised again", in(phaseDrained, fsmA), observation{kind: obsApplied}, phaseIdle, []drainAction{actUncordon}},
		{"drained, a transient failure: advertised again, retried by the rate limiter", in(phaseDrained, fsmA), observation{kind: obsApplied, err: errors.New("nvml")}, phaseIdle, []drainAction{actUncordon}},
		{"drained, change refused: failed, advertised again", in(phaseDrained, fsmA), observation{kind: obsApplied, err: outcome.Newf(v1alpha1.ReasonGPUBusy, "pid 7")}, phaseFailed, []drainAction{actUncordon}},
		{"drained, reached by other means: uncordon and converge", in(phaseDrained, fsmA), passFor(fsmA, notDisruptive), phaseIdle, []drainAction{actUncordon, actConverge}},
		// Failed and Backoff
		{"failed, before the retry time: backoff", backingOff(phaseFailed), passFor(fsmA), phaseBackoff, nil},
		{"backoff, before the retry time: still", backingOff(phaseBackoff), passFor(fsmA, at(59*time.Second)), phaseBackoff, nil},
		{"failed, retry time reached: cordon again", backingOff(phaseFailed), passFor(fsmA, at(time.Minute)), phaseCordoned, []drainAction{actCordon}},
		{"backoff, retry time reached: cordon again", backingOff(phaseBackoff), passFor(fsmA, at(2*time.Minute)), phaseCordoned, []drainAction{actCordon}},
		{"backoff, spec change: drain at once", backingOff(phaseBackoff), passFor(fsmB), phaseCordoned, []drainAction{actCordon}},
		{"backoff, no longer disruptive: converge, nothing to uncordon", backingOff(phaseBackoff), passFor(fsmA, notDisruptive), phaseIdle, []drainAction{actConverge}},
		{"failed, spec change refused: converge reports it", backingOff(phaseFailed), passFor(fsmB, notAdmitted), phaseIdle, []drainAction{actConverge}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.obs.now.IsZero() {
				tt.obs.now = fsmNow
			}
			got, acts := next(tt.from, tt.obs)
			if got.phase != tt.phase || !reflect.DeepEqual(acts, tt.acts) {
				t.Errorf("next(%s, %+v) = %s %v, want %s %v", tt.from.phase, tt.obs.kind, got.phase, acts, tt.phase, tt.acts)
			}
			if got.phase == phaseCordoned && got.key != tt.obs.want.key {
				t.Errorf("cordoned for key %q, want the observed spec's %q", got.key, tt.obs.want.key)
			}
		})
	}
}

func TestDrainStartsANewRunAndIgnoresTheOldOnesMessages(t *testing.T) {
	s, _ := next(in(phaseCordoned, fsmA), passFor(fsmA))
	if s.seq != 4 || !s.started.Equal(fsmNow) || s.view.target != fsmA.target {
		t.Fatalf("started %+v, want run 4 started now for %s", s, fsmA.target)
	}
	s, _ = next(s, observation{kind: obsProgress, seq: 3, view: drainView{pods: []string{"old/pod"}}})
	if len(s.view.pods) != 0 {
		t.Errorf("an earlier run's progress reached the view: %v", s.view.pods)
	}
	s, _ = next(s, observation{kind: obsProgress, seq: 4, view: drainView{pods: []string{"a/x"}, listed: true}})
	if !reflect.DeepEqual(s.view.pods, []string{"a/x"}) {
		t.Errorf("this run's progress did not reach the view: %v", s.view.pods)
	}
	s, _ = next(s, observation{kind: obsDrainEnded, now: fsmNow, seq: 4, err: vacate.ErrTimeout, remaining: []string{"a/x"}, backoff: time.Minute})
	o, ok := outcome.As(s.failure)
	if !ok || o.Reason != v1alpha1.ReasonDrainTimedOut || s.failures != 1 || !s.retryAt.Equal(fsmNow.Add(time.Minute)) || !reflect.DeepEqual(s.view.pods, []string{"a/x"}) {
		t.Errorf("after a timeout: %+v (failure %v), want DrainTimedOut, 1 failure, retry in 1m, a/x remaining", s, s.failure)
	}
}

func TestAFailureAfterTheRetryKeepsCountingAndASpecChangeResetsTheCount(t *testing.T) {
	s, _ := next(backingOff(phaseBackoff), passFor(fsmA, at(time.Minute)))
	if s.failures != 2 {
		t.Errorf("a retry after the backoff counts %d failures, want 2 kept", s.failures)
	}
	s, _ = next(backingOff(phaseBackoff), passFor(fsmB))
	if s.failures != 0 || s.failure != nil {
		t.Errorf("a spec change kept failures %d and %v", s.failures, s.failure)
	}
}

func TestDrainViewKeepsAnEvictionMessageWhileItsPodRemains(t *testing.T) {
	x, y := vacate.PodRef{Namespace: "a", Name: "x"}, vacate.PodRef{Namespace: "b", Name: "y"}
	v := drainView{}.with(vacate.Step{Kind: vacate.StepListed, Pods: []vacate.PodRef{x, y}})
	if !v.listed || !reflect.DeepEqual(v.pods, []string{"a/x", "b/y"}) {
		t.Fatalf("listed: %+v", v)
	}
	v = v.with(vacate.Step{Kind: vacate.StepEvictionBlocked, Pods: []vacate.PodRef{x}, Message: "eviction of a/x blocked"})
	v = v.with(vacate.Step{Kind: vacate.StepWaiting, Pods: []vacate.PodRef{x}})
	if v.message != "eviction of a/x blocked" {
		t.Errorf("the message about a/x went while a/x remains: %+v", v)
	}
	v = v.with(vacate.Step{Kind: vacate.StepWaiting, Pods: []vacate.PodRef{y}})
	if v.message != "" {
		t.Errorf("the message about a/x stayed after a/x left: %q", v.message)
	}
	v = v.with(vacate.Step{Kind: vacate.StepListFailed, Message: "kubelet unavailable"})
	v = v.with(vacate.Step{Kind: vacate.StepWaiting, Pods: []vacate.PodRef{y}})
	if v.message != "" {
		t.Errorf("a list failure's message stayed after a list succeeded: %q", v.message)
	}
	if v = v.with(vacate.Step{Kind: vacate.StepVacated}); len(v.pods) != 0 || !v.listed {
		t.Errorf("idle: %+v", v)
	}
}

// TestMessagesOutsideTheirPhaseChangeNothing pins the rest of the table: a drain's progress or end
// counts only while it drains, an apply result only after a drain; anything else is a late message of a
// drain the spec already left.
func TestMessagesOutsideTheirPhaseChangeNothing(t *testing.T) {
	for p := phaseIdle; p <= phaseBackoff; p++ {
		from := in(p, fsmA)
		for _, o := range []observation{
			{kind: obsProgress, seq: 3, view: drainView{pods: []string{"a/x"}}},
			{kind: obsDrainEnded, seq: 3, err: vacate.ErrTimeout},
			{kind: obsApplied, err: outcome.Newf(v1alpha1.ReasonGPUBusy, "pid 7")},
		} {
			if (o.kind == obsProgress || o.kind == obsDrainEnded) && p == phaseDraining || o.kind == obsApplied && p == phaseDrained {
				continue // the transitions TestDrainTransitions pins
			}
			got, acts := next(from, o)
			if !reflect.DeepEqual(got, from) || len(acts) != 0 {
				t.Errorf("%s + %v: %s %v, want unchanged and no action", p, o.kind, got.phase, acts)
			}
		}
	}
}
