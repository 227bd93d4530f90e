package scheduler

import (
	"slices"
	"time"
)

// Gangs never keep an idle GPU from a client that could use it.
//
// A gang takes all its GPUs at once so that a collective finds every peer running, but a member that
// does not run on one of them leaves that GPU idle. Two cases, each bounded:
//
//   - A running turn whose members on one GPU neither hold nor ask for GangIdleWindow (from the turn's
//     start or their last release) while someone outside the gang waits for it (in its line, or another
//     gang by its ticket) hands that GPU back (lent): it grants as if no gang reserved it, the gang's
//     own members there included, in the GPU's ordinary order (production first). The rest of the
//     turn is unchanged. A member that asks on a lent GPU waits as a single client does: its holder in
//     the way goes at its quantum plus grace.
//   - A GPU claimed for a gang that waits for another of its GPUs' holders grants the waiters outside
//     the gang in the GPU's ordinary order, each until the moment the last of those holders is due to
//     be revoked (holdEnd: the gang's start cannot come earlier), told so at once (CONTENDED). The
//     gang's wait is never longer for it: a lent hold ends no later than the hold the gang waits for.
//
// GangIdleWindow is the shim's default idle window: a member that has not asked for that long has no
// work queued on that GPU (it releases after the same window).
const GangIdleWindow = KeptTurnIdle

// lendIdleLocked hands back each GPU of g's running turn whose members there stayed idle for
// GangIdleWindow while someone outside g waits for it (awaitedLocked), and arms a decision for the
// first GPU that will qualify later.
func (co *Gangs) lendIdleLocked(g *gang, now time.Time) {
	var next time.Time
	for _, q := range g.gpus() {
		if co.owner[q] != g || !co.awaitedLocked(g, q) {
			continue
		}
		if g.busyOn(q) {
			continue
		}
		since := g.turnStart
		for _, c := range g.members {
			if c.gpu == q && c.lastRun.After(since) {
				since = c.lastRun
			}
		}
		at := since.Add(GangIdleWindow)
		if now.Before(at) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		q.log.V(1).Info("Gang idle on a GPU someone waits for, handing it back", "gang", g.key, "idle", now.Sub(since))
		delete(co.owner, q)
		g.lent = append(g.lent, q)
		co.markLocked(q, nil)
	}
	co.armLendLocked(g, next, now)
}

// awaitedLocked: someone outside g waits for q, in its line or by another gang's ticket.
func (co *Gangs) awaitedLocked(g *gang, q *queue) bool {
	for _, line := range q.waiting {
		if slices.ContainsFunc(line, func(c *client) bool { return outsider(g, c) }) {
			return true
		}
	}
	for _, o := range co.byKey {
		if o != g && o.ticket != 0 && o.state == gangIdle && slices.Contains(o.gpus(), q) {
			return true
		}
	}
	return false
}

// armLendLocked arms a decision at next (zero: none).
func (co *Gangs) armLendLocked(g *gang, next, now time.Time) {
	if g.lend != nil && g.lendAt.Equal(next) {
		return
	}
	co.stopLendLocked(g)
	if next.IsZero() {
		return
	}
	g.lendAt = next
	g.lend = co.clock.AfterFunc(next.Sub(now), func() {
		co.mu.Lock()
		defer co.mu.Unlock()
		if g.lend == nil || !g.lendAt.Equal(next) {
			return
		}
		g.lend = nil
		co.settleLocked(nil, nil)
	})
}

func (co *Gangs) stopLendLocked(g *gang) {
	if g.lend != nil {
		g.lend.Stop()
		g.lend = nil
	}
	g.lendAt = time.Time{}
}

// lentLocked: c is a member of a running gang that handed its GPU back; it waits in the GPU's line.
func lentLocked(c *client) bool {
	g := gangOf(c)
	return g != nil && g.state == gangRunning && slices.Contains(g.lent, c.gpu)
}

// claimEndLocked is when g, which claimed q, can start at the earliest as far as its other GPUs' holders
// go: the latest moment one of them is due to be revoked. False when none holds: g waits for q only.
func (co *Gangs) claimEndLocked(g *gang, q *queue) (time.Time, bool) {
	var end time.Time
	found := false
	now := co.clock.Now()
	for _, o := range g.gpus() {
		if o == q {
			continue
		}
		for _, h := range o.holders {
			if !outsider(g, h) {
				continue
			}
			at := o.holdEndLocked(h)
			switch {
			case h.revokeTimer != nil:
				at = h.revokeAt
			case g.production() && h.class == ClassOpportunistic && h.lentUntil.IsZero():
				at = now // preempted by the claim
			}
			if !found || at.After(end) {
				end, found = at, true
			}
		}
	}
	return end, found && end.After(now)
}

// grantedLocked arms the end of h's hold of q when q is claimed for a gang that waits for its other
// GPUs: h holds it on loan until the gang can start.
func (co *Gangs) grantedLocked(q *queue, h *client) {
	g := co.claimantLocked(q)
	if g == nil || !outsider(g, h) || !h.state.granted() {
		return
	}
	end, ok := co.claimEndLocked(g, q)
	if !ok {
		end = co.clock.Now()
	}
	h.lentUntil = end
	h.contendedSent = true
	q.sendLocked(h, Message{Type: MsgContended, Epoch: h.epoch, Waiters: uint32(q.nWaitingLocked())})
	if h.revokeTimer != nil {
		h.revokeTimer.Stop()
	}
	q.armRevokeLocked(h, end)
}
