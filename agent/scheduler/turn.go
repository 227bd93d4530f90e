package scheduler

import (
	"slices"
	"time"
)

// Preempted turns.
//
// A production client takes the GPU from an opportunistic holder at once (qos.go), and gives it back
// within milliseconds, at every request it serves. The preempted client keeps the rest of its turn
// (its quantum, counted from the turn's start, turnStart): when it asks again it goes to the front
// of the opportunistic line, and until its turn ends no other opportunistic client takes its place:
// on an exclusive GPU none is granted while it has not asked again, and on a budget none evicts its
// memory. Its turn ends at its quantum, or KeptTurnIdle after the GPU is free of production if it has
// not asked again by then (it had no more work: busy.go); the next in line runs.
//
// Otherwise each of production's requests would hand the GPU to the next opportunistic client in
// line, which, on an oversubscribed GPU, evicts the preempted one's memory: trainers would swap at
// every request (docs/qos.md: evictions against preemptions). A preempted trainer does not always ask
// again before production releases (its thread may still wait in the driver for its own queued work),
// so keeping its place in line when it asks is not enough: the turn is kept whether it has asked yet
// or not.

// keepTurnLocked is called when production preempts h: h keeps its turn if quantum is left, until
// that turn ends.
func (q *queue) keepTurnLocked(h *client) {
	end := h.turnStart.Add(q.quantum)
	now := q.clock.Now()
	if !now.Before(end) {
		return
	}
	h.resuming = true
	q.armTurnEndLocked(h, end)
}

// armTurnEndLocked (re)arms the end of h's preempted turn at end (capKeptTurnsLocked brings it closer).
func (q *queue) armTurnEndLocked(h *client, end time.Time) {
	if h.turnTimer != nil {
		h.turnTimer.Stop()
	}
	start := h.turnStart
	h.turnEnd = end
	h.turnTimer = q.clock.AfterFunc(end.Sub(q.clock.Now()), func() { q.endTurn(h, start) })
}

// endTurn ends the preempted turn that began at start, if h has not asked again since: the next
// opportunistic client in line may take the GPU and h's memory. A waiter keeps its place (its turn
// ends with the hold it is about to get), and a holder's turn is its hold's.
func (q *queue) endTurn(h *client, start time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if h.state != stateIdle || !h.resuming || !h.turnStart.Equal(start) {
		return
	}
	h.resuming = false
	h.turnTimer = nil
	q.dispatchLocked(nil)
}

// resumeTurnLocked moves c, which has just asked for the GPU, to the front of the opportunistic line
// if it keeps a preempted turn: behind the waiters resuming turns that began before its own, ahead of
// everyone else.
func (q *queue) resumeTurnLocked(c *client) {
	if !c.resuming {
		return
	}
	if c.class != ClassOpportunistic {
		c.resuming = false
		return
	}
	line := slices.DeleteFunc(q.waiting[ClassOpportunistic], func(w *client) bool { return w == c })
	i := 0
	for i < len(line) && line[i].resuming && !line[i].turnStart.After(c.turnStart) {
		i++
	}
	q.waiting[ClassOpportunistic] = slices.Insert(line, i, c)
}

// turnKeptLocked: an opportunistic client that has not asked again keeps a preempted turn, so head,
// which does not, must not take the GPU on an exclusive GPU (on a budget, mayEvictFor keeps its
// memory instead).
func (q *queue) turnKeptLocked(head *client) bool {
	if head.class != ClassOpportunistic || head.resuming {
		return false
	}
	for _, c := range q.clients {
		if c.resuming && c.state == stateIdle {
			return true
		}
	}
	return false
}

// resumingFirstLocked: the opportunistic waiters resuming preempted turns lead their line, oldest turn first.
func (q *queue) resumingFirstLocked() bool {
	line := q.waiting[ClassOpportunistic]
	for i := 1; i < len(line); i++ {
		prev, w := line[i-1], line[i]
		if w.resuming && (!prev.resuming || prev.turnStart.After(w.turnStart)) {
			return false
		}
	}
	return true
}
