package scheduler

import "time"

// DefaultEvictTimeout bounds how long a client that does not run may take to answer an EVICT. A shim
// answers as soon as it has copied the asked bytes out (its eviction waits only for a stream capture
// in progress to end), so seconds are plenty; a client that lets it pass holds memory that waiters
// and holders' memory requests are waiting for.
const DefaultEvictTimeout = 10 * time.Second

// evictTimeoutOrDefault is the EVICT deadline in force (queues built without New get the default).
func (q *queue) evictTimeoutOrDefault() time.Duration {
	if q.evictTimeout > 0 {
		return q.evictTimeout
	}
	return DefaultEvictTimeout
}

// armEvictDeadlineLocked starts the clock on the EVICT just sent to c. A client that lets it pass is
// dropped: its lease ends, its reservation returns to the budget and the process continues in
// pass-through, so one client that ignores EVICT cannot stall the GPU's waiters for good.
func (q *queue) armEvictDeadlineLocked(c *client) {
	if c.evictTimer != nil {
		c.evictTimer.Stop()
	}
	seq := c.evictions
	c.evictTimer = q.clock.AfterFunc(q.evictTimeoutOrDefault(), func() { q.evictOverdue(c, seq) })
}

// stopEvictDeadlineLocked: c answered (or left).
func (q *queue) stopEvictDeadlineLocked(c *client) {
	if c.evictTimer != nil {
		c.evictTimer.Stop()
		c.evictTimer = nil
	}
}

func (q *queue) evictOverdue(c *client, seq uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.clients[c.id] != c || !c.evictPending || c.evictions != seq {
		return // answered or gone; the timer lost the race
	}
	c.evictTimer = nil
	q.log.Info("Dropping shim client that ignored an eviction; its memory leaves the budget and it continues in pass-through",
		"client", c.id, "pid", c.pid, "reservation", c.reservation, "target", c.evictTarget, "deadline", q.evictTimeoutOrDefault())
	q.droppedEvict.Inc()
	q.leaveLocked(c)
	c.drop()
}

// restartHoldLocked starts a budget holder's hold when its first report says its memory is in. Until
// then the revocation deadline ran from the grant (a holder that never reports loses the GPU at
// quantum + grace after it, as a lock-only holder does); from now on it runs from this moment, or,
// for a hold that resumes a preempted turn, from that turn's start (qos.go).
func (q *queue) restartHoldLocked(c *client) {
	if q.setStateLocked(c, stateRunning) != nil {
		return
	}
	c.grantedAt = q.clock.Now()
	if !c.resuming {
		c.turnStart = c.grantedAt
	}
	if c.revokeTimer != nil {
		c.revokeTimer.Stop()
		c.revokeTimer = nil
	}
	if c.contendedSent {
		q.contendLocked()
	}
}
