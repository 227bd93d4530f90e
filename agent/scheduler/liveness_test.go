package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// A waiter's Ping is answered under the queue's lock; a wedged queue (its lock held) does not answer.
func TestPingIsAnsweredUnderTheQueueLock(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	w := fx.join(t, ClassOpportunistic)
	fx.q.pong(w.c, 7)
	if p, ok := w.last(MsgPong); !ok || p.Seq != 7 {
		t.Fatalf("a Ping of seq 7 got %+v, want a Pong of seq 7", w.got)
	}
	fx.q.mu.Lock()
	done := make(chan struct{})
	go func() { fx.q.pong(w.c, 8); close(done) }()
	select {
	case <-done:
		t.Fatal("a Pong went out while the queue's lock was held")
	case <-time.After(50 * time.Millisecond):
	}
	fx.q.mu.Unlock()
	<-done
	if p, _ := w.last(MsgPong); p.Seq != 8 {
		t.Errorf("after the lock was free the answer was %+v, want seq 8", p)
	}
}

// Policy goes only to version 6 clients of a scheduler that allows the environment's overrides (the
// standalone one); the agent's scheduler sends none, which the shim reads as "none allowed".
func TestPolicyAllowsOverridesOnlyWhereTheSchedulerDoes(t *testing.T) {
	for _, c := range []struct {
		name    string
		allow   bool
		version uint16
		want    bool
	}{
		{"agent", false, 0, false},
		{"standalone", true, 0, true},
		{"standalone, version 5 client", true, 5, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fx := newQueueFixture(t, time.Second, time.Second)
			fx.q.envOverrides = c.allow
			fx.version = c.version
			f := fx.join(t, ClassOpportunistic)
			p, ok := f.last(MsgPolicy)
			if ok != c.want || (ok && p.Flags != PolicyEnvOverrides) {
				t.Fatalf("got %+v, want a Policy allowing overrides: %v", f.got, c.want)
			}
			if ok && f.got[1].Type != MsgPolicy {
				t.Errorf("Policy is not right after Welcome: %+v", f.got)
			}
		})
	}
}

// The bound a client reports in force reaches its state (the GPUNode status) and the metric.
func TestReportedLaunchBoundReachesStateAndMetric(t *testing.T) {
	e := startEnv(t, GPUConfig{Quantum: time.Second})
	c := dialRaw(t, e.sock, ClassOpportunistic)
	c.send(Message{Type: MsgPacing, MaxQueued: 0, Pacing: PacingBackoff})
	var st ClientState
	wait.Until(t, 5*time.Second, func() bool {
		cs := e.s.Snapshot()
		if len(cs) == 1 {
			st = cs[0]
		}
		return st.PacingKnown
	}, "the scheduler records the reported bound")
	if st.LaunchBound != 0 || st.PacingState != PacingBackoff {
		t.Errorf("state has bound %d from %v, want 0 from Backoff", st.LaunchBound, st.PacingState)
	}
	mfs, err := e.m.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "gpusharing_scheduler_client_launch_bound" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == "Backoff" {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error("gpusharing_scheduler_client_launch_bound{source=\"Backoff\"} is missing")
	}
}

// Long load: production holds the GPU without a gap for many times an opportunistic shim's wait timeout
// (300 ms here). The waiter never passes through while the scheduler answers it, and runs without the
// lock once the scheduler is gone.
func TestWaiterBehindGaplessProductionWaitsWhileTheSchedulerAnswers(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	prod := dialRaw(t, e.sock, ClassProduction) // the standalone rule: the hello decides the class
	prod.hold()                                 // and never releases
	c := e.startClient([]string{"GPUSHARE_WAIT_TIMEOUT_MS=300"}, "dlsym", "5")
	var st ClientState
	wait.Until(t, 20*time.Second, func() bool {
		s, ok := e.state(c.pid())
		st = s
		return ok && s.Pings >= 30 // a Ping after 75 ms of silence: 30 span seven timeouts and more
	}, "the waiter's liveness questions are answered")
	if !st.Waiting || c.exited() || e.readTrace().count(c.pid()) != 0 {
		t.Fatalf("behind production that keeps the GPU the waiter passed through: waiting=%v exited=%v launches=%d",
			st.Waiting, c.exited(), e.readTrace().count(c.pid()))
	}
	e.s.Close() // the scheduler is gone: its connection ends
	c.wait(t, 10*time.Second)
	if out := c.stderr.String(); !strings.Contains(out, "the GPU scheduler went away") {
		t.Errorf("the waiter finished without saying the scheduler went away: %s", out)
	}
}
