package scheduler

import (
	"slices"
	"testing"
	"time"
)

// turnFixture is an oversubscribed GPU (64 MiB) with two opportunistic clients that do not fit
// together (40 MiB each) and a production one (10 MiB): a holds with its memory in and b waits for
// it, told of it at a's grant (t = 0; quantum 100 ms, grace 50 ms).
func turnFixture(t *testing.T) (fx *queueFixture, a, b, p *fakeClient) {
	t.Helper()
	fx = newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAuto, ProductionPriority: threshold(1000)})
	a, b, p = fx.joinAs(t, pod(0)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(b.c, 40*mib)
	if !fx.whole(a) || !fx.waiting(b) || a.count(MsgContended) != 1 {
		t.Fatalf("setup: a whole=%v contended %d, b waiting=%v", fx.whole(a), a.count(MsgContended), fx.waiting(b))
	}
	return fx, a, b, p
}

// preemptAndReturn has production take the GPU at `at` into a's turn, a ask again at once (its shim
// does on its next launch), and production release 5 ms later.
func preemptAndReturn(t *testing.T, fx *queueFixture, a, p *fakeClient, at time.Duration) {
	t.Helper()
	preempt(t, fx, a, p, at)
	fx.q.acquire(a.c, 40*mib)
	fx.clock.Advance(5 * time.Millisecond)
	fx.q.release(p.c, grantEpoch(t, p), 10*mib)
}

// preempt has production take the GPU at `at` into a's turn.
func preempt(t *testing.T, fx *queueFixture, a, p *fakeClient, at time.Duration) {
	t.Helper()
	fx.clock.Advance(at)
	fx.q.acquire(p.c, 10*mib)
	if a.count(MsgRevoked) == 0 || !fx.whole(p) {
		t.Fatalf("a revoked %d times, production whole=%v: want a preempted", a.count(MsgRevoked), fx.whole(p))
	}
}

// A preempted opportunistic holder keeps its turn: when production releases it runs again with the
// memory it kept, ahead of the waiter that would have evicted it, and its quantum still counts from
// its first grant. Without this, every production request moved 40 MiB of the two clients' memory.
func TestPreemptedOpportunisticHolderKeepsItsTurn(t *testing.T) {
	fx, a, b, p := turnFixture(t)
	for i, at := range []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond} {
		preemptAndReturn(t, fx, a, p, at)
		if !fx.whole(a) || fx.holding(b) || a.count(MsgEvict) != 0 {
			t.Fatalf("after production's request %d: a whole=%v, b holding=%v, a evicted %d times; want a back with its memory",
				i+1, fx.whole(a), fx.holding(b), a.count(MsgEvict))
		}
	}
	// t = 75 ms: a's turn (granted at 0) ends at quantum + grace, 150 ms, however often it was preempted.
	fx.clock.Advance(74 * time.Millisecond)
	if a.count(MsgRevoked) != 3 {
		t.Fatalf("a revoked %d times before its quantum + grace, want only its 3 preemptions", a.count(MsgRevoked))
	}
	fx.clock.Advance(time.Millisecond)
	if a.count(MsgRevoked) != 4 || !fx.holding(b) {
		t.Fatalf("at 150 ms: a revoked %d times, b holding=%v; want a's turn over and b granted", a.count(MsgRevoked), fx.holding(b))
	}
	if e, ok := a.last(MsgEvict); !ok || e.Target != 14*mib {
		t.Fatalf("a's evict = %+v (%v), want it asked down to 14 MiB for b", e, ok)
	}
}

// The turn is kept before the preempted client asks again (its thread may still wait in the driver
// when production releases): the waiter neither runs nor evicts it, and when it asks it runs at once.
func TestPreemptedTurnIsKeptBeforeItsClientAsksAgain(t *testing.T) {
	fx, a, b, p := turnFixture(t)
	preempt(t, fx, a, p, 20*time.Millisecond)
	fx.clock.Advance(5 * time.Millisecond)
	fx.q.release(p.c, grantEpoch(t, p), 10*mib)
	fx.clock.Advance(KeptTurnIdle - time.Millisecond) // t = 74 ms: a's turn is kept to 75 ms
	if fx.holding(b) || a.count(MsgEvict) != 0 {
		t.Fatalf("b holding=%v, a evicted %d times; want a's turn and memory kept", fx.holding(b), a.count(MsgEvict))
	}
	fx.q.acquire(a.c, 40*mib)
	if !fx.whole(a) || a.count(MsgEvict) != 0 {
		t.Fatalf("a whole=%v, evicted %d times; want it running again with its memory", fx.whole(a), a.count(MsgEvict))
	}
}

// A preempted client that does not ask again (its work is done) loses its turn KeptTurnIdle after
// production released, long before its quantum ends (the GPU must not idle for the rest of it): the
// waiter runs then, evicting it.
func TestAPreemptedTurnNotTakenUpEndsKeptTurnIdleAfterProductionReleases(t *testing.T) {
	fx, a, b, p := turnFixture(t)
	preempt(t, fx, a, p, 20*time.Millisecond)
	fx.clock.Advance(10 * time.Millisecond) // production holds: the turn is kept whatever the wait
	fx.q.release(p.c, grantEpoch(t, p), 10*mib)
	fx.clock.Advance(KeptTurnIdle - time.Millisecond)
	if fx.holding(b) {
		t.Fatal("b granted before a's kept turn ended")
	}
	fx.clock.Advance(time.Millisecond) // t = 80 ms: KeptTurnIdle after the release, a's quantum is at 100 ms
	if !fx.holding(b) {
		t.Fatal("b not granted KeptTurnIdle after production released")
	}
	if e, ok := a.last(MsgEvict); !ok || e.Target != 14*mib {
		t.Fatalf("a's evict = %+v (%v), want it asked down to 14 MiB for b", e, ok)
	}
}

// On an exclusive GPU a preempted turn is kept too: the waiter is not granted until the preempted
// client has asked again and its turn is over.
func TestPreemptedTurnIsKeptOnAnExclusiveGPU(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	a, b, p := fx.joinAs(t, pod(0)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	fx.clock.Advance(20 * time.Millisecond)
	fx.q.acquire(p.c, 0)
	fx.q.release(p.c, grantEpoch(t, p), 0)
	if fx.holding(b) {
		t.Fatal("b took a's preempted turn")
	}
	fx.q.acquire(a.c, 0)
	if !fx.holding(a) || fx.holding(b) {
		t.Fatalf("a holding=%v, b holding=%v; want a back", fx.holding(a), fx.holding(b))
	}
	fx.clock.Advance(130 * time.Millisecond) // t = 150 ms: a's quantum + grace from its first grant
	if !fx.holding(b) {
		t.Fatal("b not granted at the end of a's turn")
	}
}

// A holder preempted after its quantum has no turn left to keep: it asks again behind the waiter.
func TestPreemptedHolderPastItsQuantumQueuesBehind(t *testing.T) {
	fx, a, b, p := turnFixture(t)
	preemptAndReturn(t, fx, a, p, 120*time.Millisecond) // inside the grace: not revoked yet
	if fx.holding(a) || !fx.holding(b) {
		t.Fatalf("a holding=%v, b holding=%v; want b, first in line, granted", fx.holding(a), fx.holding(b))
	}
}

// Two preempted holders (Auto runs opportunistic clients together) resume in the order their turns
// began, whatever order they ask again in, ahead of a waiter that asked before either.
func TestPreemptedTurnsResumeOldestFirst(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAuto, ProductionPriority: threshold(1000)})
	a, b, w, p := fx.joinAs(t, pod(0)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	fx.q.acquire(a.c, 20*mib)
	fx.clock.Advance(time.Millisecond)
	fx.q.acquire(b.c, 20*mib)
	fx.q.acquire(w.c, 30*mib) // 24 free: waits for a or b
	fx.q.acquire(p.c, 0)
	fx.q.acquire(b.c, 20*mib)
	fx.q.acquire(a.c, 20*mib)
	fx.q.mu.Lock()
	got := clientIDs(fx.q.waiting[ClassOpportunistic])
	fx.q.mu.Unlock()
	if want := []uint32{a.c.id, b.c.id, w.c.id}; !slices.Equal(got, want) {
		t.Fatalf("opportunistic line %v, want %v", got, want)
	}
}
