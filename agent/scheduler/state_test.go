package scheduler

import (
	"errors"
	"testing"
	"time"
)

// transition takes exactly the moves of clientTransitions: every other pair of states, and a state
// out of range, is refused with errIllegalTransition.
func TestTransitionTakesOnlyTheTable(t *testing.T) {
	legal := []struct{ from, to clientState }{
		{stateIdle, stateWaiting},
		{stateWaiting, stateRunning},
		{stateWaiting, stateStarting},
		{stateWaiting, stateFilling},
		{stateFilling, stateStarting},
		{stateStarting, stateRunning},
		{stateFilling, stateIdle},
		{stateStarting, stateIdle},
		{stateRunning, stateIdle},
		{stateIdle, stateGone},
		{stateWaiting, stateGone},
	}
	isLegal := map[[2]clientState]bool{}
	for _, tc := range legal {
		isLegal[[2]clientState{tc.from, tc.to}] = true
		if err := transition(tc.from, tc.to); err != nil {
			t.Errorf("%v -> %v refused: %v", tc.from, tc.to, err)
		}
	}
	if len(clientTransitions) != len(legal) {
		t.Errorf("clientTransitions has %d moves, this test knows %d", len(clientTransitions), len(legal))
	}
	for from := range numClientStates + 1 {
		for to := range numClientStates + 1 {
			if isLegal[[2]clientState{from, to}] {
				continue
			}
			if err := transition(from, to); !errors.Is(err, errIllegalTransition) {
				t.Errorf("%v -> %v: err = %v, want errIllegalTransition", from, to, err)
			}
		}
	}
}

// Named cases of moves that must never happen: each is a bug the old flags could represent.
func TestTransitionRefusesWhatTheFlagsAllowed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to clientState
	}{
		{"a waiter cannot wait again (queued twice)", stateWaiting, stateWaiting},
		{"a holder cannot be queued while it holds", stateRunning, stateWaiting},
		{"a client that left cannot come back", stateGone, stateWaiting},
		{"a client that left cannot be granted", stateGone, stateRunning},
		{"an idle client cannot be granted without waiting", stateIdle, stateRunning},
		{"a running holder does not go back to filling", stateRunning, stateFilling},
		{"a running holder does not start again", stateRunning, stateStarting},
		{"a filling holder starts before it runs", stateFilling, stateRunning},
		{"a holder ends its hold before it leaves", stateRunning, stateGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := transition(tc.from, tc.to); !errors.Is(err, errIllegalTransition) {
				t.Fatalf("%v -> %v: err = %v, want errIllegalTransition", tc.from, tc.to, err)
			}
		})
	}
}

// setStateLocked refuses an illegal move without crashing: the client keeps its state and its
// lists, the violation is recorded, and the client is dropped so that its connection's end takes it
// out of the queue.
func TestSetStateRefusesAnIllegalMoveAndDropsTheClient(t *testing.T) {
	fx := newQueueFixture(t, time.Second, time.Second)
	fx.ignoreViolations = true
	a := fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 0)
	fx.q.mu.Lock()
	err := fx.q.setStateLocked(a.c, stateWaiting)
	st, holders, waiting, violations := a.c.state, len(fx.q.holders), fx.q.nWaitingLocked(), len(fx.q.violations)
	fx.q.mu.Unlock()
	if !errors.Is(err, errIllegalTransition) {
		t.Fatalf("running -> waiting: err = %v", err)
	}
	if st != stateRunning || holders != 1 || waiting != 0 || violations != 1 || !a.dropped {
		t.Fatalf("after the refusal: %v, %d holders, %d waiting, %d violations, dropped=%v; want running, 1, 0, 1, true",
			st, holders, waiting, violations, a.dropped)
	}
	fx.q.leave(a.c)
	if fx.holder() != nil {
		t.Fatal("the dropped client still holds after it left")
	}
}

// checkBudget: what rises and what falls, with and without a budget, for a Rejoin and for anything else.
func TestCheckBudget(t *testing.T) {
	const budget = 64 * mib
	for _, tc := range []struct {
		name             string
		budget, reserved uint64
		from, to, need   uint64
		rejoin, wantErr  bool
	}{
		{"a rise into free budget, up to the need", budget, 40 * mib, 0, 24 * mib, 24 * mib, false, false},
		{"a rise that fills the budget exactly", budget, 40 * mib, 10 * mib, 34 * mib, 40 * mib, false, false},
		{"a rise beyond the free budget", budget, 40 * mib, 0, 25 * mib, 40 * mib, false, true},
		{"a rise beyond the need", budget, 0, 20 * mib, 24 * mib, 10 * mib, false, true},
		{"a fall, even above the budget", budget, 80 * mib, 40 * mib, 10 * mib, 40 * mib, false, false},
		{"a fall below the need", budget, 40 * mib, 40 * mib, 0, 40 * mib, false, false},
		{"no change above the budget", budget, 80 * mib, 40 * mib, 40 * mib, 40 * mib, false, false},
		{"a rise while the sum is above the budget", budget, 80 * mib, 10 * mib, 11 * mib, 40 * mib, false, true},
		{"any rise without a budget", 0, 0, 0, 1, 1, false, true},
		{"a Rejoin beyond the free budget", budget, 40 * mib, 0, 40 * mib, 40 * mib, true, false},
		{"a Rejoin of the whole budget", budget, 64 * mib, 0, budget, budget, true, false},
		{"a Rejoin beyond the budget itself", budget, 0, 0, budget + 1, budget + 1, true, true},
		{"a Rejoin on top of a reservation", budget, 10 * mib, 10 * mib, 20 * mib, 20 * mib, true, true},
		{"a Rejoin without a budget", 0, 0, 0, mib, mib, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkBudget(tc.budget, tc.reserved, tc.from, tc.to, tc.need, tc.rejoin)
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkBudget(budget %d, reserved %d, %d -> %d, need %d, rejoin %v) = %v, want error %v",
					tc.budget, tc.reserved, tc.from, tc.to, tc.need, tc.rejoin, err, tc.wantErr)
			}
		})
	}
}

// The queue holds to the budget rule itself: a rise it is asked for against it is refused and
// recorded, the account unchanged.
func TestReservationAgainstTheBudgetRuleIsRefused(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	fx.ignoreViolations = true
	a := fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.q.mu.Lock()
	fx.q.setReservationLocked(a.c, 50*mib) // beyond its need
	res, reserved, violations := a.c.reservation, fx.q.reserved, len(fx.q.violations)
	fx.q.mu.Unlock()
	if res != 40*mib || reserved != 40*mib || violations != 1 {
		t.Fatalf("reservation %d MiB, reserved %d MiB, %d violations; want 40, 40, 1", res/mib, reserved/mib, violations)
	}
}

// A client dropped for ignoring an EVICT leaves the queue at once, before its reader has noticed the
// connection's end; an Acquire read meanwhile must not queue it. Before the client state had a
// "gone", it was queued and granted without being a client: the lock and its reservation were
// held by nobody the queue could evict or drop.
func TestClientThatLeftIsNotQueuedByAnAcquireReadBefore(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	fx.q.evictTimeout = time.Second
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	fx.q.acquire(b.c, 40*mib) // a is asked to evict 16 MiB
	fx.clock.Advance(time.Second)
	if !a.dropped {
		t.Fatal("a was not dropped at its EVICT deadline")
	}
	fx.q.release(b.c, grantEpoch(t, b), 0)
	fx.q.acquire(a.c, 8*mib)
	fx.q.mu.Lock()
	st, holders, waiting, reserved := a.c.state, len(fx.q.holders), fx.q.nWaitingLocked(), fx.q.reserved
	fx.q.mu.Unlock()
	if st != stateGone || holders != 0 || waiting != 0 || reserved != 0 || a.count(MsgGrant) != 1 {
		t.Fatalf("after a's late Acquire: a %v, %d holders, %d waiting, %d MiB reserved, %d grants to a; want gone, 0, 0, 0, 1",
			st, holders, waiting, reserved/mib, a.count(MsgGrant))
	}
}
