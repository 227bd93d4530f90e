package scheduler

// Overlapping the two directions of a hand-off (protocol version 3).
//
// In series, a hand-off would copy the leaver's memory out (one copy engine,
// device to host) and only then the newcomer's in (the other engine). Instead
// the evicted client reports each release as it goes (USAGE progress), and
// the next holder is granted as soon as the evictions under way cover what it
// misses, with the reservation that is free at that moment; every progress
// report lowers the leaver's reservation and raises the newcomer's by what it
// freed (RAISE), so the newcomer maps and copies in while the leaver still
// copies out. Its gate opens, and its quantum starts, only when all of its
// memory is in (its USAGE report).
//
// The budget rule (checkBudget) is untouched: the newcomer's reservation rises
// only from free budget, and the leaver's falls only by its own reports (acks as
// for any report). A
// version 2 client is never granted partially: it waits for the whole eviction,
// and so does every client of a GPU with SerialHandoffs.

// fillsPartially: the client understands a partial Grant and Raise.
func (c *client) fillsPartially() bool { return c.version == 0 || c.version >= 3 }

// evictingLocked is what the evictions under way will still free.
func (q *queue) evictingLocked() uint64 {
	var n uint64
	for _, o := range q.clients {
		if o.evictPending && o.reservation > o.evictTarget {
			n += o.reservation - o.evictTarget
		}
	}
	return n
}

// grantFillingLocked grants the head waiter before its need is free when the
// evictions under way cover the rest (evictLocked has just made sure of them),
// so that it swaps in while they copy out. Otherwise it waits, as before.
func (q *queue) grantFillingLocked(head *client, handoff bool) {
	if q.serial || !head.fillsPartially() || q.overLocked() > 0 {
		return
	}
	missing := head.need - head.reservation // > free: the caller checked
	if q.free()+q.evictingLocked() < missing {
		return // an eviction that cannot free everything: wait for the whole (the retry timer asks again)
	}
	q.setReservationLocked(head, head.reservation+q.free())
	q.grantLocked(head, handoff, true)
}

// fillLocked hands freed budget to the holders filling in (Raise) and says
// whether one is still filling, in which case nothing else is granted: what
// the evictions free is promised to it.
func (q *queue) fillLocked() bool {
	busy := false
	for _, h := range q.holders {
		if h.state != stateFilling {
			continue
		}
		// Its need may have fallen below its reservation since the grant (a report after a free).
		if give := min(h.need-min(h.reservation, h.need), q.free()); give > 0 {
			q.setReservationLocked(h, h.reservation+give)
			h.raises++
			q.sendLocked(h, Message{Type: MsgRaise, Epoch: h.epoch, Resident: h.reservation})
		}
		if h.reservation >= h.need {
			_ = q.setStateLocked(h, stateStarting) // its quantum still starts at its report that all is in
			continue
		}
		missing := h.need - h.reservation
		if q.free()+q.evictingLocked() < missing {
			// An eviction gave up part way (it could not copy out): ask the others for the rest.
			q.evictLocked(missing-q.free()+q.overLocked(), h)
		}
		// Others wait while what it misses is on its way; if nobody can give it, they go on and the
		// holder's swap-in gives the grant back after GPUSHARE_MEMREPLY_TIMEOUT_MS (gate.c).
		if q.free()+q.evictingLocked() >= missing {
			busy = true
		}
	}
	return busy
}
