package scheduler

import (
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/prom"
)

// A budget holder that is granted and then never reports (nor releases) loses the GPU at quantum +
// grace after its grant, as a lock-only holder does; before the fix its hold never started, so it was
// never revoked and its waiter waited for good.
func TestBudgetHolderThatNeverReportsIsRevokedAtQuantumPlusGrace(t *testing.T) {
	for _, mode := range []Mode{ModeAlways, ModeAuto} {
		t.Run(mode.String(), func(t *testing.T) {
			fx := newBudgetFixture(t, 64*mib, mode) // quantum 100ms, grace 50ms
			a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
			fx.q.acquire(a.c, 40*mib)
			fx.q.acquire(b.c, 40*mib) // does not fit beside a (Auto), or waits its turn (Always)
			if !fx.holding(a) || fx.holding(b) {
				t.Fatal("a should hold and b wait")
			}
			fx.clock.Advance(149 * time.Millisecond)
			if a.count(MsgRevoked) != 0 {
				t.Fatal("revoked before quantum + grace")
			}
			fx.clock.Advance(time.Millisecond)
			if a.count(MsgRevoked) != 1 || fx.holding(a) {
				t.Fatal("a holder that never reported kept the GPU past quantum + grace")
			}
			// Its memory is still reserved: it is asked to evict it, and, silent still, dropped at the
			// EVICT deadline, after which the waiter runs.
			if a.count(MsgEvict) != 1 {
				t.Fatalf("the revoked holder was asked to evict %d times", a.count(MsgEvict))
			}
			fx.clock.Advance(DefaultEvictTimeout)
			if !a.dropped || !fx.holding(b) {
				t.Fatalf("after the EVICT deadline: a dropped=%v, b holding=%v", a.dropped, fx.holding(b))
			}
		})
	}
}

// A client that does not run and ignores an EVICT is dropped at the deadline: its reservation returns
// to the budget and the waiter the eviction was for gets all it needs (it was granted what was free
// when the eviction began, to swap in while the eviction ran). Before the fix the waiter waited for good.
func TestClientIgnoringEvictIsDroppedAtTheDeadline(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	fx.q.evictTimeout = 2 * time.Second
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 50*mib)
	fx.report(a, UsageReport, 50*mib, 50*mib)
	fx.q.release(a.c, grantEpoch(t, a), 50*mib) // a keeps its 50 MiB resident, not running
	fx.q.acquire(b.c, 40*mib)
	if a.count(MsgEvict) != 1 || fx.whole(b) {
		t.Fatalf("want a asked to evict and b without all it needs; evicts=%d", a.count(MsgEvict))
	}
	fx.clock.Advance(2*time.Second - time.Millisecond)
	if a.dropped || fx.whole(b) {
		t.Fatal("dropped before the deadline")
	}
	fx.clock.Advance(time.Millisecond) // a never answers
	if !a.dropped {
		t.Fatal("a client that ignored EVICT was not dropped at the deadline")
	}
	if !fx.whole(b) || fx.reserved() != 40*mib {
		t.Fatalf("after the drop: b holding all it needs=%v reserved=%d MiB", fx.whole(b), fx.reserved()/mib)
	}
	if v := prom.CounterValue(t, fx.m.dropped.WithLabelValues("GPU-test", DropEvictTimeout)); v != 1 {
		t.Fatalf("evict-timeout drops = %v", v)
	}
}

// A client that answers its EVICT in time is never dropped, however long it then stays idle.
func TestClientAnsweringEvictInTimeIsKept(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 50*mib)
	fx.report(a, UsageReport, 50*mib, 50*mib)
	fx.q.release(a.c, grantEpoch(t, a), 50*mib)
	fx.q.acquire(b.c, 40*mib)
	fx.clock.Advance(DefaultEvictTimeout / 2)
	fx.report(a, UsageEvicted, 50*mib, 24*mib)
	fx.clock.Advance(2 * DefaultEvictTimeout)
	if a.dropped || !fx.holding(b) {
		t.Fatalf("a dropped=%v, b holding=%v", a.dropped, fx.holding(b))
	}
}
