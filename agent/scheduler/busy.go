package scheduler

import (
	"fmt"
	"time"
)

// Terms by who is busy, not who is connected.
//
// PACE (a bound on an opportunistic client's queue) protects production from the backlog a preempted
// trainer leaves; IDLE 1 ms (production's short idle window) hands production's gaps to opportunistic
// work. Each costs the other class something, so each is in force only while the class it serves is
// busy: PACE while a production client waits, holds or did within ProductionRecent; IDLE while an
// opportunistic client waits, holds or did within RecentActivity. An inference replica that is connected but serves nothing does not
// slow the trainers, and a connected opportunistic process that has nothing to run does not make
// production hand the GPU over after every request.
//
// A client becomes busy when it asks for the GPU, so the terms its class sets go out in the dispatch
// that handles its ACQUIRE, before a preemption's REVOKED. The first request after production was idle
// longer than RecentActivity therefore meets an opportunistic backlog that was not bounded yet, once.

// RecentActivity is how long after its last wait or hold a client still counts as busy for the terms
// of the other class. Long enough that a serving inference replica, whose requests are milliseconds to
// seconds apart, keeps the trainers paced between them (so its requests never meet an unbounded
// backlog), and a trainer keeps production's short window across its data-loading and checkpoint pauses;
// short enough that a replica idle for longer gives the trainers back their speed.
const RecentActivity = 10 * time.Second

// KeptTurnIdle bounds how long a preempted opportunistic client keeps its turn (turn.go) once the GPU
// is free of production without it asking again: a holder with nothing to run releases after its idle
// window (the shim's default, GPUSHARE_IDLE_MS, is 50 ms), so one that has not asked again by then has
// nothing to run, and the GPU must not idle for the rest of its quantum.
const KeptTurnIdle = 50 * time.Millisecond

// ProductionRecent is how long after its last wait or hold a production client still counts as busy
// for the opportunistic clients' launch bound (PACE, PACE_TIME). With release on completion (SETTLE)
// production holds only while its work is queued or running, so a replica that served a request
// within the last second keeps the bound on across its gaps (a request every few milliseconds to a
// second meets a bounded backlog), and a trainer beside a replica idle for longer runs unbounded, as if
// alone. Its next request sends the bound before the preemption and meets the unbounded backlog once.
const ProductionRecent = time.Second

// recent is how long c counts as busy after its last wait or hold: ProductionRecent for a production
// client, RecentActivity for an opportunistic one.
func recent(c *client) time.Duration {
	if c.class == ClassProduction {
		return ProductionRecent
	}
	return RecentActivity
}

// busyLocked: c waits for or holds the GPU, or did within recent(c) of now.
func (q *queue) busyLocked(c *client, now time.Time) bool {
	if c.state == stateWaiting || c.state.granted() {
		return true
	}
	return !c.lastBusy.IsZero() && now.Sub(c.lastBusy) < recent(c)
}

// busyClassLocked: a connected client of class p is busy.
func (q *queue) busyClassLocked(p Class) bool {
	now := q.clock.Now()
	for _, c := range q.clients {
		if c.class == p && q.busyLocked(c, now) {
			return true
		}
	}
	return false
}

// armTermsLocked arms the re-evaluation of the terms at the next moment a client stops counting as
// busy (termsLocked calls it).
func (q *queue) armTermsLocked() {
	now := q.clock.Now()
	var next time.Time
	for _, c := range q.clients {
		if c.state == stateWaiting || c.state.granted() || !q.busyLocked(c, now) {
			continue
		}
		if at := c.lastBusy.Add(recent(c)); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if !q.termsAt.IsZero() && q.termsAt.Equal(next) {
		return
	}
	if q.termsTimer != nil {
		q.termsTimer.Stop()
		q.termsTimer = nil
	}
	q.termsAt = next
	if next.IsZero() {
		return
	}
	q.termsTimer = q.clock.AfterFunc(next.Sub(now), func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if !q.termsAt.Equal(next) {
			return // re-armed meanwhile
		}
		q.termsTimer, q.termsAt = nil, time.Time{}
		q.termsLocked()
	})
}

// capKeptTurnsLocked ends, KeptTurnIdle from now, the preempted turns of idle opportunistic clients
// while no production client holds or waits (dispatchLocked calls it).
func (q *queue) capKeptTurnsLocked() {
	if len(q.waiting[ClassProduction]) > 0 || q.productionHoldsLocked() {
		return
	}
	end := q.clock.Now().Add(KeptTurnIdle)
	for _, c := range q.clients {
		if c.resuming && c.state == stateIdle && c.turnEnd.After(end) {
			q.armTurnEndLocked(c, end)
		}
	}
}

// busyInvariantLocked is qosInvariantLocked's part about activity, for a connected client.
func (q *queue) busyInvariantLocked(c *client) error {
	now := q.clock.Now()
	switch {
	case c.state != stateWaiting && !c.state.granted() && q.busyLocked(c, now) &&
		(q.termsTimer == nil || q.termsAt.After(c.lastBusy.Add(recent(c)))):
		return fmt.Errorf("client %d counts as busy until %v with no re-evaluation armed by then (armed: %v)", c.id,
			c.lastBusy.Add(recent(c)), q.termsAt)
	case c.resuming && c.state == stateIdle && len(q.waiting[ClassProduction]) == 0 && !q.productionHoldsLocked() &&
		c.turnEnd.After(now.Add(KeptTurnIdle)):
		return fmt.Errorf("client %d keeps a preempted turn until %v, past %v with the GPU free of production", c.id,
			c.turnEnd, KeptTurnIdle)
	}
	return nil
}
