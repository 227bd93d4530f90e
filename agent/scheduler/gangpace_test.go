package scheduler

import (
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Production preempting an opportunistic gang on GPU 1 bounds the launch queue of its member on GPU 0
// too (PACE), for as long as production is busy on any of the gang's GPUs.
func TestPreemptedGangIsPacedOnEveryGPU(t *testing.T) {
	e := startGangEnv(t, 2, true)
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	p1 := e.dial(1, 4000, ClassProduction)
	x0.hold()
	x1.hold()
	epoch := p1.hold() // the gang is preempted: at once on GPU 1, after the grace on GPU 0
	if m := x0.expect(MsgPace, time.Second); m.MaxQueued != DefaultOpportunisticQueue {
		t.Fatalf("PACE to the member on GPU 0 = %d, want %d", m.MaxQueued, DefaultOpportunisticQueue)
	}
	if m := x1.expect(MsgPace, time.Second); m.MaxQueued != DefaultOpportunisticQueue {
		t.Fatalf("PACE to the member on GPU 1 = %d, want %d", m.MaxQueued, DefaultOpportunisticQueue)
	}
	e.clock.Advance(gangGrace)
	x0.expect(MsgRevoked, time.Second)
	p1.send(Message{Type: MsgRelease, Epoch: epoch})
	wait.Until(t, time.Second, func() bool { return !e.state(1, p1).Holding }, "p1 released")
	e.clock.Advance(RecentActivity) // production idle: the bound lifts on both GPUs
	if m := x0.expect(MsgPace, time.Second); m.MaxQueued != 0 {
		t.Fatalf("PACE to the member on GPU 0 once production is idle = %d, want 0", m.MaxQueued)
	}
}
