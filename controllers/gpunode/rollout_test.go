package gpunode

import (
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestNextWakesTheFirstWaitingNodesUpToTheLimit(t *testing.T) {
	r := newRollout(nil)
	for _, n := range []string{"n3", "n1", "n4", "n2"} {
		r.setWaiting(n, []string{"p"})
	}
	r.setLimit("p", 2)
	if got := fmt.Sprint(r.next("p")); got != "[n1 n2]" {
		t.Errorf("next = %s, want [n1 n2]", got)
	}
	if got := r.next("other"); len(got) != 0 {
		t.Errorf("next of a policy nobody waits on = %v, want none", got)
	}
}

func TestANodeLeavingAWaitListNudgesTheNextOnes(t *testing.T) {
	r := newRollout(nil)
	r.setLimit("p", 1)
	r.setWaiting("n1", []string{"p"})
	r.setWaiting("n2", []string{"p"})
	if len(r.nudges) != 0 {
		t.Fatalf("joining a wait list nudged %d nodes", len(r.nudges))
	}
	r.setWaiting("n1", nil)
	if len(r.nudges) != 1 {
		t.Fatalf("leaving a wait list nudged %d nodes, want 1", len(r.nudges))
	}
	if ev := <-r.nudges; ev.Object.GetName() != "n2" {
		t.Errorf("nudged %s, want n2", ev.Object.GetName())
	}
}

func TestReservationsCountUntilTheCacheShowsTheWrite(t *testing.T) {
	r := newRollout(nil)
	r.reserve("p", "n1")
	tests := []struct {
		name   string
		cached []string
		self   string
		want   int
	}{
		{"a reserved node the cache does not show yet counts", nil, "n2", 1},
		{"a reserved node the cache already shows counts once", []string{"n1"}, "n2", 1},
		{"the asking node does not count itself", []string{"n1", "n3"}, "n1", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.othersInFlight(tt.cached, "p", tt.self); got != tt.want {
				t.Errorf("othersInFlight = %d, want %d", got, tt.want)
			}
		})
	}
	r.unreserve("n1", []string{"p"})
	if got := r.othersInFlight(nil, "p", "n2"); got != 0 {
		t.Errorf("after unreserve othersInFlight = %d, want 0", got)
	}
}

func TestAReservationEndsWhenTheCacheShowsTheWrittenGeneration(t *testing.T) {
	r := newRollout(nil)
	r.reserve("p", "n1")
	r.observed("n1", 7)
	if got := r.othersInFlight(nil, "p", "n2"); got != 1 {
		t.Fatalf("a cache event before the write was recorded ended the reservation (count %d)", got)
	}
	r.written("n1", []string{"p"}, 8)
	r.observed("n1", 7)
	if got := r.othersInFlight(nil, "p", "n2"); got != 1 {
		t.Fatalf("an older generation in the cache ended the reservation (count %d)", got)
	}
	r.observed("n1", 8)
	if got := r.othersInFlight(nil, "p", "n2"); got != 0 {
		t.Errorf("the written generation in the cache left the reservation counting (count %d)", got)
	}
}

func TestAReservationTheCacheNeverReportsExpiresAfterItsTTL(t *testing.T) {
	c := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	r := newRollout(c)
	r.reserve("p", "n1")
	c.SetTime(c.Now().Add(reservationTTL - time.Second))
	if got := r.othersInFlight(nil, "p", "n2"); got != 1 {
		t.Fatalf("a reservation within its TTL counts %d, want 1", got)
	}
	c.SetTime(c.Now().Add(time.Second))
	if got := r.othersInFlight(nil, "p", "n2"); got != 0 {
		t.Errorf("a reservation past its TTL still counts (%d): a missed cache event would hold the slot forever", got)
	}
}

func TestARememberedNodeCountServesOnlyWhileFresh(t *testing.T) {
	c := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	r := newRollout(c)
	r.rememberSelected("p", 3, 40)
	if n, ok := r.selectedCount("p", 3); !ok || n != 40 {
		t.Fatalf("a fresh count: %d %v, want 40", n, ok)
	}
	if _, ok := r.selectedCount("p", 4); ok {
		t.Error("a count of another generation served")
	}
	c.SetTime(c.Now().Add(selectedCountTTL + time.Millisecond))
	if _, ok := r.selectedCount("p", 3); ok {
		t.Error("a count older than its TTL served")
	}
}
