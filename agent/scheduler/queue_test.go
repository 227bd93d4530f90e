package scheduler

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/prom"
)

// fakeClient records what the queue sent it.
type fakeClient struct {
	c       *client
	got     []Message
	dropped bool
	full    bool
}

func (f *fakeClient) last(t MsgType) (Message, bool) {
	for i := len(f.got) - 1; i >= 0; i-- {
		if f.got[i].Type == t {
			return f.got[i], true
		}
	}
	return Message{}, false
}

func (f *fakeClient) count(t MsgType) int {
	n := 0
	for _, m := range f.got {
		if m.Type == t {
			n++
		}
	}
	return n
}

type queueFixture struct {
	q     *queue
	clock *fakeClock
	m     *Metrics
	// version the clients join with (0: the current one; MinVersion: a client without the
	// overlapped hand-off)
	version uint16
	// ignoreViolations: the test breaks an invariant on purpose (state_test.go).
	ignoreViolations bool
}

// checkViolations fails t, at its end, on any invariant the queue saw broken.
func (fx *queueFixture) checkViolations(t *testing.T) {
	t.Cleanup(func() {
		fx.q.mu.Lock()
		defer fx.q.mu.Unlock()
		if !fx.ignoreViolations && len(fx.q.violations) > 0 {
			t.Errorf("the queue saw %d broken invariants: %v", len(fx.q.violations), fx.q.violations)
		}
	})
}

func newQueueFixture(t *testing.T, quantum, grace time.Duration) *queueFixture {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	q := newQueue(GPUConfig{UUID: "GPU-test", Quantum: quantum, Grace: grace}, clock, m, logr.Discard())
	fx := &queueFixture{q: q, clock: clock, m: m}
	fx.checkViolations(t)
	return fx
}

// join connects a client whose hello decides its class (no Options.PodPriority).
func (fx *queueFixture) join(t *testing.T, prio Class) *fakeClient {
	t.Helper()
	return fx.joinAs(t, classSource{asked: prio})
}

// joinAs connects a client whose class src decides.
func (fx *queueFixture) joinAs(t *testing.T, src classSource) *fakeClient {
	t.Helper()
	f := &fakeClient{}
	f.c = fx.q.join(100, src, fx.version, func(b []byte) bool {
		if f.full {
			return false
		}
		m, err := Decode(b)
		if err != nil {
			t.Fatalf("queue sent an undecodable message: %v", err)
		}
		f.got = append(f.got, m)
		return true
	}, func() { f.dropped = true })
	return f
}

func (fx *queueFixture) holder() *client {
	fx.q.mu.Lock()
	defer fx.q.mu.Unlock()
	return fx.q.holderLocked()
}

func grantEpoch(t *testing.T, f *fakeClient) uint32 {
	t.Helper()
	g, ok := f.last(MsgGrant)
	if !ok {
		t.Fatalf("client %d was never granted; got %+v", f.c.id, f.got)
	}
	return g.Epoch
}

func TestQueueWelcomesWithQuantumAndGrace(t *testing.T) {
	fx := newQueueFixture(t, 200*time.Millisecond, 80*time.Millisecond)
	a := fx.join(t, ClassOpportunistic)
	w, ok := a.last(MsgWelcome)
	if !ok || w.QuantumMS != 200 || w.GraceMS != 80 || w.ClientID != a.c.id {
		t.Fatalf("welcome = %+v, %v", w, ok)
	}
}

func TestQueueGrantsAFreeLockAtOnce(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a := fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	if fx.holder() != a.c {
		t.Fatal("free lock was not granted")
	}
	if g, _ := a.last(MsgGrant); g.QuantumMS != 1000 {
		t.Errorf("grant quantum = %d ms, want 1000", g.QuantumMS)
	}
	if a.c.waits != 0 {
		t.Errorf("an immediate grant counted as a wait")
	}
}

func TestQueueTellsHolderWhenSomeoneWaits(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	if a.count(MsgContended) != 0 {
		t.Fatal("holder told of contention with nobody waiting")
	}
	fx.q.acquire(b.c, 0)
	c, ok := a.last(MsgContended)
	if !ok || c.Epoch != grantEpoch(t, a) || c.Waiters != 1 {
		t.Fatalf("contended = %+v, %v", c, ok)
	}
}

// Behind a production holder (which no one preempts), a production waiter that asked last goes first,
// then the opportunistic ones in the order they asked.
func TestQueueHandsOffToHighPriorityFirstThenFIFO(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	holder := fx.join(t, ClassProduction)
	n1, n2 := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	h1 := fx.join(t, ClassProduction)
	fx.q.acquire(holder.c, 0)
	fx.q.acquire(n1.c, 0)
	fx.q.acquire(n2.c, 0)
	fx.q.acquire(h1.c, 0) // arrives last, goes first
	order := []*fakeClient{h1, n1, n2}
	cur := holder
	for _, want := range order {
		fx.q.release(cur.c, grantEpoch(t, cur), 0)
		if fx.holder() != want.c {
			t.Fatalf("after client %d released, holder = %v, want client %d", cur.c.id, fx.holder(), want.c.id)
		}
		cur = want
	}
	if got := prom.CounterValue(t, fx.m.handoffs.WithLabelValues("GPU-test")); got != 3 {
		t.Errorf("handoffs_total = %v, want 3", got)
	}
}

func TestQueueIgnoresStaleRelease(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	old := grantEpoch(t, a)
	fx.q.release(a.c, old, 0)
	fx.q.acquire(b.c, 0)
	fx.q.acquire(a.c, 0)
	fx.q.release(a.c, old, 0) // a repeats an old release while b holds
	if fx.holder() != b.c {
		t.Fatal("a stale release from a non-holder moved the lock")
	}
	fx.q.release(b.c, old, 0)
	if fx.holder() != b.c {
		t.Fatal("a release with another epoch moved the lock")
	}
}

func TestQueueRevokesHolderPastQuantumPlusGraceWhenOthersWait(t *testing.T) {
	fx := newQueueFixture(t, 100*time.Millisecond, 50*time.Millisecond)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	epoch := grantEpoch(t, a)
	fx.q.acquire(b.c, 0)
	fx.clock.Advance(149 * time.Millisecond)
	if fx.holder() != a.c || a.count(MsgRevoked) != 0 {
		t.Fatal("revoked before quantum + grace")
	}
	fx.clock.Advance(time.Millisecond)
	r, ok := a.last(MsgRevoked)
	if !ok || r.Epoch != epoch {
		t.Fatalf("holder not told REVOKED for epoch %d: %+v", epoch, a.got)
	}
	if fx.holder() != b.c {
		t.Fatal("lock did not pass to the waiter after revocation")
	}
	if got := prom.CounterValue(t, fx.m.revocations.WithLabelValues("GPU-test")); got != 1 {
		t.Errorf("revocations_total = %v, want 1", got)
	}
	// The revoked client's late release of its void epoch changes nothing.
	fx.q.release(a.c, epoch, 0)
	if fx.holder() != b.c {
		t.Fatal("late release of a revoked epoch moved the lock")
	}
}

func TestQueueGivesGraceAfterLateContention(t *testing.T) {
	fx := newQueueFixture(t, 100*time.Millisecond, 50*time.Millisecond)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	fx.clock.Advance(time.Second) // alone: may hold as long as it likes
	if a.count(MsgRevoked) != 0 {
		t.Fatal("revoked with nobody waiting")
	}
	fx.q.acquire(b.c, 0)
	fx.clock.Advance(49 * time.Millisecond)
	if a.count(MsgRevoked) != 0 {
		t.Fatal("revoked before the grace period that follows contention")
	}
	fx.clock.Advance(time.Millisecond)
	if a.count(MsgRevoked) != 1 || fx.holder() != b.c {
		t.Fatal("not revoked once the grace period after contention ended")
	}
}

func TestQueueDoesNotRevokeAHolderThatReleasedInTime(t *testing.T) {
	fx := newQueueFixture(t, 100*time.Millisecond, 50*time.Millisecond)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	fx.clock.Advance(120 * time.Millisecond)
	fx.q.release(a.c, grantEpoch(t, a), 0)
	fx.clock.Advance(40 * time.Millisecond) // a's old deadline passes while b holds
	if a.count(MsgRevoked) != 0 || b.count(MsgRevoked) != 0 {
		t.Fatal("a timer from an ended hold revoked someone")
	}
	if fx.holder() != b.c {
		t.Fatal("lock did not stay with b")
	}
}

func TestQueueFreesTheLockWhenTheHolderLeaves(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	fx.q.leave(a.c)
	if fx.holder() != b.c {
		t.Fatal("waiter did not get the lock of a departed holder")
	}
	fx.q.leave(b.c)
	if fx.holder() != nil {
		t.Fatal("lock still held after every client left")
	}
}

func TestQueueForgetsAWaiterThatLeaves(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a, b, c := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	fx.q.acquire(c.c, 0)
	fx.q.leave(b.c)
	fx.q.release(a.c, grantEpoch(t, a), 0)
	if fx.holder() != c.c {
		t.Fatal("lock went to a departed waiter")
	}
}

func TestQueueDropsAClientThatStopsReading(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	a.full = true
	fx.q.acquire(b.c, 0) // CONTENDED to a cannot be queued
	if !a.dropped {
		t.Fatal("client with a full outbox was not dropped")
	}
}

func TestQueueSnapshotReportsWaitsAndHoldTime(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	a, b := fx.join(t, ClassProduction), fx.join(t, ClassProduction)
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	fx.clock.Advance(300 * time.Millisecond)
	fx.q.release(a.c, grantEpoch(t, a), 0)
	fx.clock.Advance(200 * time.Millisecond)
	s := fx.q.snapshot()
	if len(s) != 2 {
		t.Fatalf("snapshot has %d clients, want 2", len(s))
	}
	sa, sb := s[0], s[1]
	if sa.Holding || sa.Waiting || sa.HoldTime != 300*time.Millisecond || sa.Waits != 0 || sa.Grants != 1 {
		t.Errorf("holder-then-released state = %+v", sa)
	}
	if !sb.Holding || sb.Class != ClassProduction || sb.Waits != 1 || sb.WaitTime != 300*time.Millisecond ||
		sb.HoldTime != 200*time.Millisecond {
		t.Errorf("waiter-then-holder state = %+v", sb)
	}
}
