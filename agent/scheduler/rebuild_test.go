package scheduler

import "testing"

// Re-announced memory may add up to more than the budget (it was mapped
// without a scheduler): the next grant evicts the excess too, so the account
// is back within the budget once the waiter runs.
func TestRebuildEvictsReannouncedMemoryBeyondTheBudget(t *testing.T) {
	const budget = 64 * mib
	fx := newBudgetFixture(t, budget, ModeAuto)
	a, b, w := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.rejoin(a.c, Message{Type: MsgRejoin, Need: 40 * mib, Resident: 40 * mib})
	fx.q.rejoin(b.c, Message{Type: MsgRejoin, Need: 40 * mib, Resident: 40 * mib})
	if got := fx.reserved(); got != 80*mib {
		t.Fatalf("reserved %d after the re-announcements, want %d (what is really resident)", got, 80*mib)
	}
	fx.q.acquire(w.c, 8*mib)
	var asked uint64
	for _, f := range []*fakeClient{a, b} {
		if m, ok := f.last(MsgEvict); ok {
			fx.q.mu.Lock()
			asked += f.c.reservation - m.Target
			fx.q.mu.Unlock()
			fx.report(f, UsageEvicted, 40*mib, m.Target)
		}
	}
	if asked < 8*mib+16*mib {
		t.Errorf("evictions asked for %d bytes; want the waiter's 8 MiB and the 16 MiB beyond the budget", asked)
	}
	if !fx.holding(w) {
		t.Fatal("the waiter was not granted after the evictions")
	}
	if got := fx.reserved(); got > budget {
		t.Errorf("reserved %d after the grant, budget %d", got, budget)
	}
}
