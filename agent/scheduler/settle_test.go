package scheduler

import (
	"testing"
	"time"
)

// SETTLE (release on completion) goes to the production clients of version 7 with the floor, under
// the terms of their short idle window: while an opportunistic client is busy, 0 once none is for
// RecentActivity; a version 6 production client gets IDLE alone. PACE_TIME goes to the opportunistic
// clients of version 7 with PACE, before it, while production is busy (ProductionRecent), and 0 with
// PACE 0 once it is not.
func TestSettleAndPaceTimeFollowTheBusyClasses(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000), SettleFloor: 80 * time.Microsecond,
		OpportunisticQueueTime: 700 * time.Microsecond})
	p := fx.joinAs(t, pod(1000))
	fx.version = 6
	p6 := fx.joinAs(t, pod(1000))
	o6 := fx.joinAs(t, pod(0))
	fx.version = 0
	o := fx.joinAs(t, pod(0))
	if len(sentValues(p, MsgSettle)) != 0 || len(sentValues(o, MsgPaceTime)) != 0 {
		t.Fatalf("SETTLE %v, PACE_TIME %v with every client connected and idle", sentValues(p, MsgSettle),
			sentValues(o, MsgPaceTime))
	}

	fx.q.acquire(o.c, 0) // an opportunistic client is busy: production settles
	if !sameValues(sentValues(p, MsgSettle), 80) || !sameValues(idles(p), 1000) {
		t.Fatalf("production told SETTLE %v, IDLE %v when an opportunistic client asked, want [80] and [1000]",
			sentValues(p, MsgSettle), idles(p))
	}
	if p6.count(MsgSettle) != 0 || !sameValues(idles(p6), 1000) {
		t.Fatalf("a version 6 production client got %d SETTLE and IDLE %v, want none and [1000]", p6.count(MsgSettle), idles(p6))
	}

	fx.q.acquire(p.c, 0) // production asks: the opportunistic holder is preempted, bounded first
	i, j := indexOf(o, MsgPaceTime), indexOf(o, MsgRevoked)
	if !sameValues(sentValues(o, MsgPaceTime), 700) || !sameValues(paces(o), DefaultOpportunisticQueue) || i < 0 || j < i ||
		indexOf(o, MsgPace) < i {
		t.Fatalf("opportunistic client got %+v, want PACE_TIME 700, then PACE %d, before its REVOKED", o.got,
			DefaultOpportunisticQueue)
	}
	if o6.count(MsgPaceTime) != 0 || !sameValues(paces(o6), DefaultOpportunisticQueue) {
		t.Fatalf("a version 6 opportunistic client got %d PACE_TIME and PACE %v, want none and [%d]", o6.count(MsgPaceTime),
			paces(o6), DefaultOpportunisticQueue)
	}

	fx.q.release(p.c, grantEpoch(t, p), 0)
	fx.clock.Advance(ProductionRecent)
	if !sameValues(sentValues(o, MsgPaceTime), 700, 0) || !sameValues(paces(o), DefaultOpportunisticQueue, 0) {
		t.Fatalf("ProductionRecent after production's last hold: PACE_TIME %v, PACE %v, want both lifted",
			sentValues(o, MsgPaceTime), paces(o))
	}
	fx.q.leave(o.c)
	fx.clock.Advance(RecentActivity)
	if !sameValues(sentValues(p, MsgSettle), 80, 0) {
		t.Fatalf("production told SETTLE %v once no opportunistic client was busy, want [80 0]", sentValues(p, MsgSettle))
	}
}

// Negative settings turn each off: production keeps the idle window alone, and the opportunistic bound
// stays in launches (the behaviour of version 6).
func TestSettleAndPaceTimeOff(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000), SettleFloor: -1, OpportunisticQueueTime: -1})
	p, o := fx.joinAs(t, pod(1000)), fx.joinAs(t, pod(0))
	fx.q.acquire(o.c, 0)
	fx.q.acquire(p.c, 0)
	if p.count(MsgSettle) != 0 || !sameValues(idles(p), 1000) {
		t.Fatalf("production got %d SETTLE and IDLE %v with SettleFloor off, want none and [1000]", p.count(MsgSettle), idles(p))
	}
	if o.count(MsgPaceTime) != 0 || !sameValues(paces(o), DefaultOpportunisticQueue) {
		t.Fatalf("opportunistic client got %d PACE_TIME and PACE %v with the queue time off, want none and [%d]",
			o.count(MsgPaceTime), paces(o), DefaultOpportunisticQueue)
	}
	if s := fx.q.gpuState(); s.SettleFloor != 0 || s.OpportunisticQueueTime != 0 {
		t.Fatalf("state says settle %v, queue time %v; want both off (0)", s.SettleFloor, s.OpportunisticQueueTime)
	}
}

// The defaults: a zero GPUConfig settles after DefaultSettleFloor and bounds DefaultOpportunisticQueueTime.
func TestSettleAndPaceTimeDefaults(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	s := fx.q.gpuState()
	if s.SettleFloor != DefaultSettleFloor || s.OpportunisticQueueTime != DefaultOpportunisticQueueTime {
		t.Fatalf("state says settle %v, queue time %v; want the defaults %v and %v", s.SettleFloor,
			s.OpportunisticQueueTime, DefaultSettleFloor, DefaultOpportunisticQueueTime)
	}
}

// indexOf is the position of f's first message of type typ, or -1.
func indexOf(f *fakeClient, typ MsgType) int {
	for i, m := range f.got {
		if m.Type == typ {
			return i
		}
	}
	return -1
}
