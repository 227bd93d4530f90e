package scheduler

import (
	"testing"
	"time"
)

// A preempted gang's member on the GPU production does not ask for keeps it for the grace, so the half
// of a collective its peer launched before the preemption can meet its own; then it is revoked.
func TestPreemptedGangKeepsItsOtherMembersForTheGrace(t *testing.T) {
	e := startGangEnv(t, 2, false)
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	h1 := e.dial(1, 4000, ClassProduction)
	x0.hold()
	x1.hold()

	h1.send(Message{Type: MsgAcquire})
	x1.expect(MsgRevoked, time.Second)
	h1.expect(MsgGrant, time.Second)
	if m := x0.expect(MsgPace, time.Second); m.MaxQueued != DefaultOpportunisticQueue {
		t.Fatalf("PACE to the kept member = %d, want the opportunistic bound %d", m.MaxQueued, DefaultOpportunisticQueue)
	}
	none(t, x0, MsgRevoked, "the member on the GPU production did not ask for was revoked before the grace")
	if st := e.state(0, x0); !st.Holding {
		t.Fatalf("member on GPU 0 = %+v, want holding through the grace", st)
	}
	e.clock.Advance(gangGrace - time.Millisecond)
	none(t, x0, MsgRevoked, "the member was revoked before the grace passed")
	e.clock.Advance(time.Millisecond)
	x0.expect(MsgRevoked, time.Second)
	if st := e.state(0, x0); st.Holding {
		t.Fatalf("member on GPU 0 = %+v after the grace, want revoked", st)
	}
}

// A kept member that releases is not revoked; one whose gang loses a member is revoked at once (the
// collective cannot finish).
func TestPreemptedGangsKeptMemberGoesWhenAPeerLeaves(t *testing.T) {
	e := startGangEnv(t, 2, false)
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	h1 := e.dial(1, 4000, ClassProduction)
	x0.hold()
	x1.hold()
	h1.send(Message{Type: MsgAcquire})
	x1.expect(MsgRevoked, time.Second)
	h1.expect(MsgGrant, time.Second)
	x1.conn.Close()
	x0.expect(MsgRevoked, time.Second)
}
