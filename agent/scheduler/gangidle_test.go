package scheduler

import (
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// A production gang holding GPU 0 whose member on GPU 1 does not ask hands GPU 1 to a production client
// of another pod after the idle window, and keeps GPU 0; its member there then waits as a single client.
func TestGangHandsAnIdleGPUBack(t *testing.T) {
	e := startGangEnv(t, 2, true)
	p0, p1 := e.dial(0, 500, ClassProduction), e.dial(1, 501, ClassProduction)
	o1 := e.dial(1, 4000, ClassProduction)
	p0.hold() // the gang's turn: GPUs 0 and 1 reserved, its member on GPU 1 never asks
	o1.send(Message{Type: MsgAcquire})
	e.waits(1, o1)
	none(t, o1, MsgGrant, "granted before the gang's member there was idle for the window")
	e.clock.Advance(GangIdleWindow)
	o1.expect(MsgGrant, time.Second)
	none(t, p0, MsgRevoked, "the gang lost GPU 0 to a client of GPU 1")
	if s := e.state(0, p0); !s.Holding {
		t.Fatalf("gang member on GPU 0 does not hold after GPU 1 was handed back: %+v", s)
	}

	p1.send(Message{Type: MsgAcquire})
	e.waits(1, p1)
	o1.expect(MsgContended, time.Second)
	e.clock.Advance(gangQuantum + gangGrace)
	o1.expect(MsgRevoked, time.Second)
	p1.expect(MsgGrant, time.Second)
	if n := prom.CounterValue(t, e.m.gangTurns.WithLabelValues("5", gangEndQuantum)); n != 0 {
		t.Errorf("gang turns ended by the quantum = %v, want 0 (nobody outside waited for GPU 0)", n)
	}
}

// A member that asks again within the idle window keeps its GPU: the gang is contended, not robbed.
func TestGangKeepsAGPUItsMemberUsesWithinTheWindow(t *testing.T) {
	e := startGangEnv(t, 2, true)
	p0, p1 := e.dial(0, 500, ClassProduction), e.dial(1, 501, ClassProduction)
	o1 := e.dial(1, 4000, ClassProduction)
	p0.hold()
	epoch := p1.hold()
	o1.send(Message{Type: MsgAcquire})
	e.waits(1, o1)
	p1.send(Message{Type: MsgRelease, Epoch: epoch})
	wait.Until(t, time.Second, func() bool { return !e.state(1, p1).Holding }, "p1 released")
	e.clock.Advance(GangIdleWindow / 2)
	p1.hold() // within the window: the GPU is still the gang's
	none(t, o1, MsgGrant, "a GPU its gang's member used within the idle window went to another pod")
}

// A production gang that claimed GPUs 0 and 1 and waits for GPU 0's holder lends GPU 1 to a client of
// another pod until that holder is due to go, so the gang starts no later than it would have.
func TestClaimedGPULentUntilTheGangCanStart(t *testing.T) {
	e := startGangEnv(t, 2, true)
	h0 := e.dial(0, 4000, ClassProduction)
	p0, p1 := e.dial(0, 500, ClassProduction), e.dial(1, 501, ClassProduction)
	o1 := e.dial(1, 4001, ClassProduction)
	h0.hold()
	p0.send(Message{Type: MsgAcquire})
	e.waits(0, p0) // the gang claims both GPUs and waits for h0
	h0.expect(MsgContended, time.Second)
	o1.send(Message{Type: MsgAcquire})
	o1.expect(MsgGrant, time.Second) // GPU 1 is idle: lent
	o1.expect(MsgContended, time.Second)
	e.clock.Advance(gangQuantum + gangGrace) // h0's quantum and grace: both go, the gang starts
	h0.expect(MsgRevoked, time.Second)
	o1.expect(MsgRevoked, time.Second)
	p0.expect(MsgGrant, time.Second)
	p1.hold()
}
