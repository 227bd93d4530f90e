package node

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// The GPU drain as a state machine: next is pure, so every transition is table-tested
// (drainfsm_test.go); drainrun.go runs the drains' goroutines and drain.go performs the actions.
//
//	Idle --disruptive--> Cordoned --> Draining --ended ok--> Drained --applied--> Idle
//	                                     |                      |
//	                                     +--ended badly--> Failed <--change refused
//	                                                          |
//	                                              Backoff <---+---> Cordoned (retry time reached)
//
// A spec change or a GPU that reaches its shape by other means leaves any phase for Idle (or a new
// drain when the new spec is disruptive too).

// drainPhase is where one GPU's drain stands.
type drainPhase int

const (
	// phaseIdle: no drain; the GPU is advertised and converged directly.
	phaseIdle drainPhase = iota
	// phaseCordoned: the device plugin hides the GPU; its drain starts in the same pass.
	phaseCordoned
	// phaseDraining: the drain's goroutine runs.
	phaseDraining
	// phaseDrained: the drain ended with no pod left; the change is applied in the same pass.
	phaseDrained
	// phaseFailed: the drain, or the change after it, failed; the GPU is advertised again as it was.
	phaseFailed
	// phaseBackoff: a failed GPU waits for its retry time.
	phaseBackoff
)

var phaseNames = [...]string{"Idle", "Cordoned", "Draining", "Drained", "Failed", "Backoff"}

func (p drainPhase) String() string { return phaseNames[p] }

// cordoned says whether the device plugin hides the GPU in this phase.
func (p drainPhase) cordoned() bool {
	return p == phaseCordoned || p == phaseDraining || p == phaseDrained
}

// drainTarget is what a drain is for, from the GPU's spec entry.
type drainTarget struct {
	// key identifies the desired sharing and drain settings; another key is a spec change.
	key     string
	target  string
	mode    v1alpha1.DrainMode
	timeout time.Duration
	// scope is what a fixed-layout change of a dynamic MIG GPU takes, when the drain is of that alone;
	// nil drains the whole GPU. A pass computes it; the drain that starts uses the one of its pass.
	scope *layoutScope
}

// drainState is one GPU's drain. It lives in memory only: an agent that restarts mid-drain has no GPU
// cordoned (its device plugin starts afresh) and drains again, which resumes the drain before it: a pod
// already terminating is waited for, not evicted twice (agent/vacate).
type drainState struct {
	phase drainPhase
	drainTarget
	// seq numbers the drain runs of this GPU; messages of an earlier run are ignored.
	seq     int
	started time.Time
	// view is the drain's progress as its goroutine last reported it.
	view drainView
	// failures counts consecutive failed drains (or changes after a drain) for this key.
	failures int
	retryAt  time.Time
	// failure is the outcome the GPU reports in Failed and Backoff; changeRefused says it came from the
	// change after a drain rather than from the drain.
	failure       error
	changeRefused bool
}

// obsKind says what an observation carries.
type obsKind int

const (
	// obsPass: a pass looks at the GPU (want, disruptive, admitted).
	obsPass obsKind = iota
	// obsProgress: the drain's goroutine reported progress (seq, view).
	obsProgress
	// obsDrainEnded: the drain's goroutine ended (seq, err, remaining).
	obsDrainEnded
	// obsApplied: the change was applied after a drain (err).
	obsApplied
)

// observation is one input of next.
type observation struct {
	kind obsKind
	now  time.Time

	want drainTarget
	// disruptive says the desired sharing differs from what is in force in a way that needs a drain.
	disruptive bool
	// admitted says the GPU can take the desired sharing (Strategies.Admit); a drain never starts for
	// a change that would be refused.
	admitted bool

	seq       int
	view      drainView
	err       error
	remaining []string

	// backoff and backoffMax are the first wait after a failure and its cap.
	backoff, backoffMax time.Duration
}

// drainAction is something the reconciler does for a transition.
type drainAction int

const (
	actCordon drainAction = iota + 1
	actStartDrain
	actStopDrain
	actUncordon
	actConverge
)

var actionNames = [...]string{"", "Cordon", "StartDrain", "StopDrain", "Uncordon", "Converge"}

func (a drainAction) String() string { return actionNames[a] }

// next is the drain's transition function.
func next(s drainState, o observation) (drainState, []drainAction) {
	switch o.kind {
	case obsProgress:
		if s.phase == phaseDraining && o.seq == s.seq {
			s.view = o.view
		}
		return s, nil
	case obsDrainEnded:
		return drainEnded(s, o)
	case obsApplied:
		return changeApplied(s, o)
	}
	return pass(s, o)
}

// pass is a pass's look at the GPU.
func pass(s drainState, o observation) (drainState, []drainAction) {
	if s.phase == phaseIdle {
		if !o.disruptive || !o.admitted {
			// Converge refuses what Admit refuses, changing nothing; no pod is evicted for it.
			return s, []drainAction{actConverge}
		}
		return drainState{phase: phaseCordoned, drainTarget: o.want, seq: s.seq}, []drainAction{actCordon}
	}
	if o.want.key != s.key || !o.disruptive {
		return moved(s, o)
	}
	switch s.phase {
	case phaseCordoned:
		s.phase, s.seq, s.started = phaseDraining, s.seq+1, o.now.Truncate(time.Second)
		s.view = drainView{target: s.target, mode: s.mode, timeout: s.timeout}
		if s.scope != nil {
			s.view.scope = strings.Join(s.scope.reasons, "; ")
		}
		return s, []drainAction{actStartDrain}
	case phaseDrained:
		return s, []drainAction{actConverge}
	case phaseFailed, phaseBackoff:
		if o.now.Before(s.retryAt) {
			s.phase = phaseBackoff
			return s, nil
		}
		// The backoff has passed: drain again for the same desired sharing (the same key), with what the
		// change takes now, counting on from here.
		return drainState{phase: phaseCordoned, drainTarget: o.want, seq: s.seq, failures: s.failures}, []drainAction{actCordon}
	}
	return s, nil // Draining: wait for the goroutine's message
}

// moved leaves a drain whose spec changed, or whose GPU reached the shape by other means: its drain and
// backoff no longer apply. A GPU that stays hidden goes straight into the next drain.
func moved(s drainState, o observation) (drainState, []drainAction) {
	var acts []drainAction
	if s.phase == phaseDraining {
		acts = append(acts, actStopDrain)
	}
	if !o.disruptive || !o.admitted {
		if s.phase.cordoned() {
			acts = append(acts, actUncordon)
		}
		return drainState{seq: s.seq}, append(acts, actConverge)
	}
	if !s.phase.cordoned() {
		acts = append(acts, actCordon)
	}
	return drainState{phase: phaseCordoned, drainTarget: o.want, seq: s.seq}, acts
}

// drainEnded takes the drain goroutine's result: the GPU is empty, or the drain timed out or failed,
// which leaves the GPU as it was, advertised again, until the retry time.
func drainEnded(s drainState, o observation) (drainState, []drainAction) {
	if s.phase != phaseDraining || o.seq != s.seq {
		return s, nil // a drain stopped by a spec change
	}
	s.view.pods, s.view.listed = slices.Clone(o.remaining), true
	if o.err == nil {
		s.phase = phaseDrained
		return s, nil
	}
	reason := v1alpha1.ReasonDrainFailed
	if errors.Is(o.err, vacate.ErrTimeout) {
		reason = v1alpha1.ReasonDrainTimedOut
	}
	return failed(s, o, outcome.Newf(reason, "%s", o.err.Error()), false), []drainAction{actUncordon}
}

// changeApplied takes the result of the change after a drain. Done, or worth a retry with the rate
// limiter's backoff (which drains again first): the drain is over. Refused (processes that belong to
// no pod: GPUBusy; a MIG mode change waiting for a reset): the GPU runs as it was until the retry time.
func changeApplied(s drainState, o observation) (drainState, []drainAction) {
	if s.phase != phaseDrained {
		return s, nil
	}
	if o.err == nil || transient(o.err) {
		return drainState{seq: s.seq}, []drainAction{actUncordon}
	}
	return failed(s, o, o.err, true), []drainAction{actUncordon}
}

func failed(s drainState, o observation, err error, changeRefused bool) drainState {
	s.phase = phaseFailed
	s.failures++
	s.retryAt = o.now.Add(backoffFor(s.failures, o.backoff, o.backoffMax)).Truncate(time.Second)
	s.failure, s.changeRefused = err, changeRefused
	return s
}

// backoffFor is the wait after the n-th consecutive failure: base, doubling per failure, at most limit.
func backoffFor(failures int, base, limit time.Duration) time.Duration {
	if base <= 0 {
		base = DefaultDrainBackoff
	}
	if limit <= 0 {
		limit = DefaultDrainBackoffMax
	}
	for i := 1; i < failures && base < limit; i++ {
		base *= 2
	}
	return min(base, limit)
}
