package node

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// drainView is what the status shows of a running drain: the pods still on the GPU and the latest
// message. The drain's goroutine folds its steps into its own copy and sends the result; no field is
// shared with the pass.
type drainView struct {
	target, message string
	// scope says what a drain of a fixed-layout change's takes alone takes, and why; empty for a whole GPU.
	scope   string
	mode    v1alpha1.DrainMode
	timeout time.Duration
	pods    []string
	listed  bool
	// messagePod is the pod the message is about (an eviction's); the message stays while that pod
	// still uses the GPU.
	messagePod string
}

// with folds one vacate step into the view.
func (v drainView) with(s vacate.Step) drainView {
	switch s.Kind {
	case vacate.StepListed, vacate.StepWaiting, vacate.StepTimedOut:
		v.listed, v.pods = true, podNames(s.Pods)
	case vacate.StepVacated:
		v.listed, v.pods = true, nil
	}
	switch s.Kind {
	case vacate.StepEvictionBlocked, vacate.StepEvicted:
		v.message, v.messagePod = s.Message, ""
		if len(s.Pods) > 0 {
			v.messagePod = s.Pods[0].String()
		}
	case vacate.StepListFailed, vacate.StepFailed, vacate.StepTimedOut:
		v.message, v.messagePod = s.Message, ""
	case vacate.StepListed, vacate.StepWaiting, vacate.StepVacated:
		if v.messagePod == "" || !slices.Contains(v.pods, v.messagePod) {
			v.message, v.messagePod = "", ""
		}
	}
	return v
}

// drainEndedMsg is a drain goroutine's last word.
type drainEndedMsg struct {
	seq       int
	err       error
	remaining []string
}

// drainRun is one running drain as the pass sees it: its cancel func and the two mailboxes its
// goroutine writes. progress holds only the latest view (a newer one replaces an unread one).
type drainRun struct {
	seq      int
	cancel   context.CancelFunc
	progress chan drainView
	ended    chan drainEndedMsg
}

// drains holds every GPU's drain state and running drain. Only the reconciler's passes (one at a
// time) touch states and runs; mu guards base, which the manager sets when it starts.
type drains struct {
	states map[string]drainState
	runs   map[string]*drainRun

	mu   sync.Mutex
	base context.Context
}

// run keeps the drains' base context for the manager's lifetime; every drain's context derives from
// it, so they all stop with the manager.
func (ds *drains) run(ctx context.Context) error {
	ds.mu.Lock()
	ds.base = ctx
	ds.mu.Unlock()
	<-ctx.Done()
	return nil
}

func (ds *drains) baseContext(fallback context.Context) context.Context {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.base == nil {
		return context.WithoutCancel(fallback)
	}
	return ds.base
}

func (ds *drains) state(uuid string) drainState { return ds.states[uuid] }

// set records a GPU's state; an Idle GPU is forgotten.
func (ds *drains) set(uuid string, s drainState) {
	if s.phase == phaseIdle {
		delete(ds.states, uuid)
		return
	}
	if ds.states == nil {
		ds.states = map[string]drainState{}
	}
	ds.states[uuid] = s
}

// start runs fn (the drain) on its own goroutine; it reports through the run's mailboxes and wakes a
// pass with notify.
func (ds *drains) start(ctx context.Context, uuid string, seq int, view drainView, fn func(context.Context, func(vacate.Step)) ([]string, error), notify func()) {
	ds.stop(uuid)
	dctx, cancel := context.WithCancel(ctx)
	run := &drainRun{seq: seq, cancel: cancel, progress: make(chan drainView, 1), ended: make(chan drainEndedMsg, 1)}
	if ds.runs == nil {
		ds.runs = map[string]*drainRun{}
	}
	ds.runs[uuid] = run
	go func() {
		progress := func(s vacate.Step) {
			view = view.with(s)
			latest(run.progress, view)
			notify()
		}
		remaining, err := fn(dctx, progress)
		run.ended <- drainEndedMsg{seq: seq, err: err, remaining: remaining}
		notify()
	}()
}

// latest puts v in a one-slot mailbox, replacing an unread value. Only the drain's goroutine sends.
func latest(ch chan drainView, v drainView) {
	for {
		select {
		case ch <- v:
			return
		default:
			select {
			case <-ch:
			default:
			}
		}
	}
}

// stop cancels the GPU's running drain, if any; its late messages are dropped with the run.
func (ds *drains) stop(uuid string) {
	if run := ds.runs[uuid]; run != nil {
		run.cancel()
		delete(ds.runs, uuid)
	}
}

// messages turns what the GPU's drain goroutine sent since the last pass into observations.
func (ds *drains) messages(uuid string, now time.Time) []observation {
	run := ds.runs[uuid]
	if run == nil {
		return nil
	}
	var out []observation
	select {
	case v := <-run.progress:
		out = append(out, observation{kind: obsProgress, now: now, seq: run.seq, view: v})
	default:
	}
	select {
	case m := <-run.ended:
		out = append(out, observation{kind: obsDrainEnded, now: now, seq: m.seq, err: m.err, remaining: m.remaining})
		delete(ds.runs, uuid)
	default:
	}
	return out
}

// uuids lists the GPUs with a drain state.
func (ds *drains) uuids() []string {
	out := make([]string, 0, len(ds.states))
	for uuid := range ds.states {
		out = append(out, uuid)
	}
	slices.Sort(out)
	return out
}

// nextRetry is the earliest retry time of a failed drain; zero when none waits.
func (ds *drains) nextRetry() time.Time {
	var next time.Time
	for _, s := range ds.states {
		if (s.phase == phaseFailed || s.phase == phaseBackoff) && (next.IsZero() || s.retryAt.Before(next)) {
			next = s.retryAt
		}
	}
	return next
}
