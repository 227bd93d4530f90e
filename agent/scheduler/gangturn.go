package scheduler

import (
	"slices"
	"sort"
	"time"
)

// A gang's turns (gang.go): the decisions the coordinator takes under its lock, and the head each
// coordinated GPU grants next.

// Ways a turn ends, as gpusharing_scheduler_gang_turns_total's "end" label.
const (
	gangEndIdle       = "idle"
	gangEndQuantum    = "quantum"
	gangEndPreempted  = "preempted"
	gangEndMemberLeft = "member_left"
	// gangEndMemberJoined: a member joined on a GPU the turn did not reserve.
	gangEndMemberJoined = "member_joined"
)

// endTurnLocked ends g's claim or turn: every member holding but keep is revoked (preempted, for
// production). A preempted gang keeps its ticket, so it goes first once production is gone; otherwise a
// member that asks again takes a new one, behind the gangs that waited meanwhile.
func (co *Gangs) endTurnLocked(g *gang, why string, keep ...*client) {
	for _, c := range g.members {
		if !c.state.granted() || slices.Contains(keep, c) {
			continue
		}
		q := c.gpu
		if why == gangEndPreempted {
			c.preemptions++
			q.preemptions.Inc()
		} else {
			c.revocations++
			q.revocations.Inc()
		}
		q.sendLocked(c, Message{Type: MsgRevoked, Epoch: c.epoch})
		q.endHoldLocked(c)
	}
	for q, o := range co.owner {
		if o == g {
			delete(co.owner, q)
			co.markLocked(q, nil)
		}
	}
	if g.revoke != nil {
		g.revoke.Stop()
		g.revoke = nil
	}
	co.stopLendLocked(g)
	g.lent = nil
	if g.state == gangRunning {
		co.metrics.gangTurns.WithLabelValues(g.key, why).Inc()
	}
	g.state, g.contended = gangIdle, false
	if why != gangEndPreempted {
		g.ticket = 0
	}
	for _, q := range g.gpus() {
		co.markLocked(q, nil)
	}
}

// markLocked queues q for a dispatch in the settling under way.
func (co *Gangs) markLocked(q *queue, acquirer *client) {
	for i := range co.dirty {
		if co.dirty[i].q == q {
			if acquirer != nil {
				co.dirty[i].acquirer = acquirer
			}
			return
		}
	}
	co.dirty = append(co.dirty, dirtyQueue{q, acquirer})
}

// maxSettlePasses bounds the decide-then-dispatch rounds of one settling. Each round's dispatches can
// start or end at most one more step of each gang (a claim, a start, an end), so a few suffice; more
// is a scheduler bug, recorded as a violation.
const maxSettlePasses = 16

// settleLocked runs the gangs' decisions and the dispatch of q and of every GPU they touch until
// nothing changes. A dispatch inside a settling (a decision's own) only marks its queue.
func (co *Gangs) settleLocked(q *queue, acquirer *client) {
	if q != nil {
		co.markLocked(q, acquirer)
	}
	if co.settling {
		return
	}
	co.settling = true
	defer func() { co.settling = false }()
	for range maxSettlePasses {
		co.decideLocked()
		if len(co.dirty) == 0 {
			return
		}
		d := co.dirty
		co.dirty = nil
		for _, e := range d {
			e.q.dispatchQueueLocked(e.acquirer)
		}
	}
	if q != nil {
		q.violationLocked(errGangsUnsettled)
	}
	co.dirty = nil
}

// decideLocked takes every decision the gangs' state allows now, marking the GPUs it touched.
func (co *Gangs) decideLocked() {
	gangs := co.sortedLocked()
	for _, g := range gangs {
		switch {
		case g.state == gangIdle:
		case !g.isGang():
			co.endTurnLocked(g, gangEndMemberLeft)
		case !g.production() && co.productionOnLocked(g):
			co.preemptTurnLocked(g) // gangpreempt.go
		case g.state == gangRunning && !g.busy():
			co.endTurnLocked(g, gangEndIdle)
		}
	}
	now := co.clock.Now()
	for _, g := range gangs {
		asks := g.isGang() && g.state == gangIdle && slices.ContainsFunc(g.members, func(c *client) bool { return c.state == stateWaiting })
		switch {
		case asks && g.ticket == 0:
			g.ticket, g.wantSince = co.nextSeqLocked(), now
		case !asks && g.state == gangIdle:
			g.ticket = 0
		}
	}
	gangs = co.sortedLocked() // tickets taken
	behind := map[*queue]bool{}
	for _, g := range gangs {
		if g.ticket == 0 || g.state != gangIdle {
			continue
		}
		ok, yields := true, false
		for _, q := range g.gpus() {
			ok = ok && co.owner[q] == nil && !behind[q] && co.claimableLocked(g, q)
			yields = yields || co.yieldsOnLocked(g, q)
		}
		if !yields {
			// Later gangs wait behind it on its GPUs. An opportunistic gang that yields to production
			// on one of them holds nobody back: a later gang (one whose own member is that production
			// client) may run meanwhile, and otherwise both would wait for each other.
			for _, q := range g.gpus() {
				behind[q] = true
			}
		}
		if ok {
			g.state = gangClaimed
			for _, q := range g.gpus() {
				co.owner[q] = g
				co.markLocked(q, nil)
			}
		}
	}
	for _, g := range gangs {
		switch {
		case g.state == gangClaimed && co.clearLocked(g):
			co.startLocked(g, now)
		case g.state == gangRunning:
			co.lendIdleLocked(g, now)
			if g.contended || co.wantedLocked(g) {
				co.contendLocked(g, now)
			}
		}
	}
}

// sortedLocked is every key's clients, asking gangs first (production gangs before opportunistic ones,
// each in ticket order: an opportunistic gang that may not claim while production waits on one of its
// GPUs must not hold a production gang behind it), then the rest by key.
func (co *Gangs) sortedLocked() []*gang {
	out := make([]*gang, 0, len(co.byKey))
	for _, g := range co.byKey {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.ticket == 0) != (b.ticket == 0) {
			return a.ticket != 0
		}
		if a.ticket != 0 && a.production() != b.production() {
			return a.production()
		}
		if a.ticket != b.ticket {
			return a.ticket < b.ticket
		}
		return a.key < b.key
	})
	return out
}

// outsider: c is not one of g's members.
func outsider(g *gang, c *client) bool { return c.gang != g || gangOf(c) == nil }

// productionOnLocked: a production client outside g waits for or holds one of g's GPUs.
func (co *Gangs) productionOnLocked(g *gang) bool {
	for _, q := range g.gpus() {
		for _, c := range q.clients {
			if outsider(g, c) && c.class == ClassProduction && (c.state == stateWaiting || c.state.granted()) {
				return true
			}
		}
	}
	return false
}

// claimableLocked: g may reserve q now. An opportunistic gang waits for production; either waits for
// the clients outside gangs that asked for q before its ticket, of its class or above (the GPU's own
// line serves them first). Other gangs' members are ordered by ticket, not here.
func (co *Gangs) claimableLocked(g *gang, q *queue) bool {
	prod := g.production()
	for _, c := range q.clients {
		if !outsider(g, c) {
			continue
		}
		if !prod && c.class == ClassProduction && (c.state == stateWaiting || c.state.granted()) {
			return false
		}
		// An opportunistic one is not served while production waits for q (g's member included):
		// waiting for it would wait for g itself.
		if c.state == stateWaiting && gangOf(c) == nil && c.arrival < g.ticket && (c.class == ClassProduction || !prod) &&
			(c.class == ClassProduction || len(q.waiting[ClassProduction]) == 0) {
			return false
		}
	}
	return true
}

// yieldsOnLocked: g is opportunistic and a production client outside it waits for or holds q.
func (co *Gangs) yieldsOnLocked(g *gang, q *queue) bool {
	if g.production() {
		return false
	}
	for _, c := range q.clients {
		if outsider(g, c) && c.class == ClassProduction && (c.state == stateWaiting || c.state.granted()) {
			return true
		}
	}
	return false
}

// clearLocked: no one outside g holds any of g's GPUs.
func (co *Gangs) clearLocked(g *gang) bool {
	for _, q := range g.gpus() {
		for _, h := range q.holders {
			if outsider(g, h) {
				return false
			}
		}
	}
	return true
}

// wantedLocked: someone outside g waits for one of the GPUs g's turn keeps and uses (a GPU where no
// member holds or asks is handed back instead, gangidle.go), in its line or by another gang's ticket;
// for a production gang, someone production (an opportunistic waiter never makes production yield).
func (co *Gangs) wantedLocked(g *gang) bool {
	mine, prod := slices.DeleteFunc(g.gpus(), func(q *queue) bool { return co.owner[q] != g || !g.busyOn(q) }), g.production()
	for _, q := range mine {
		if slices.ContainsFunc(q.waiting[ClassProduction], func(c *client) bool { return outsider(g, c) }) ||
			(!prod && slices.ContainsFunc(q.waiting[ClassOpportunistic], func(c *client) bool { return outsider(g, c) })) {
			return true
		}
	}
	for _, o := range co.byKey {
		if o != g && o.ticket != 0 && o.state == gangIdle && (!prod || o.production()) &&
			slices.ContainsFunc(o.gpus(), func(q *queue) bool { return slices.Contains(mine, q) }) {
			return true
		}
	}
	return false
}

// startLocked starts g's turn: one quantum for all its GPUs, from now.
func (co *Gangs) startLocked(g *gang, now time.Time) {
	co.stopLingerLocked(g) // members kept from a preempted turn hold on into this one
	g.state, g.turnStart, g.contended = gangRunning, now, false
	g.quantum, g.grace = 0, 0
	for i, q := range g.gpus() {
		if i == 0 || q.quantum < g.quantum {
			g.quantum = q.quantum
		}
		if i == 0 || q.grace < g.grace {
			g.grace = q.grace
		}
		co.markLocked(q, nil)
	}
	for _, c := range g.members {
		if c.state.granted() { // held since before its gang formed: the hold joins the turn
			c.turnStart, c.contendedSent = now, false
			if c.revokeTimer != nil {
				c.revokeTimer.Stop()
				c.revokeTimer = nil
			}
		}
	}
	g.turns++
	g.waited += now.Sub(g.wantSince)
	co.metrics.gangWait.WithLabelValues(g.key).Add(now.Sub(g.wantSince).Seconds())
}

// contendLocked tells g's holding members someone waits (a member granted later in the turn, at its
// grant) and arms the end of its turn at quantum plus grace (or grace from now, past its quantum).
func (co *Gangs) contendLocked(g *gang, now time.Time) {
	for _, c := range g.members {
		if c.state.granted() && !c.contendedSent {
			c.contendedSent = true
			c.gpu.sendLocked(c, Message{Type: MsgContended, Epoch: c.epoch, Waiters: uint32(c.gpu.nWaitingLocked())})
		}
	}
	if g.contended {
		return
	}
	g.contended = true
	end := g.turnStart.Add(g.quantum)
	if now.After(end) {
		end = now
	}
	end = end.Add(g.grace)
	start := g.turnStart
	g.revoke = co.clock.AfterFunc(end.Sub(now), func() {
		co.mu.Lock()
		defer co.mu.Unlock()
		if g.state != gangRunning || !g.turnStart.Equal(start) {
			return
		}
		g.revoke = nil
		co.endTurnLocked(g, gangEndQuantum)
		co.settleLocked(nil, nil)
	})
}

// headLocked is the client a GPU coordinated with gangs grants next, or nil. A GPU reserved for a
// running gang grants its members only; one claimed, nobody but on loan until the gang can start
// (gangidle.go: its other holders are told to go, or preempted by a production gang); a free one, the
// first waiter outside the gangs (or of a gang that handed the GPU back), except an opportunistic one
// while a production member waits; a member holding there outside its gang's turn is told to go
// when anyone waits.
func (co *Gangs) headLocked(q *queue) *client {
	if g := co.owner[q]; g != nil {
		if g.state == gangClaimed {
			for _, h := range slices.Clone(q.holders) {
				switch {
				case !outsider(g, h) || !h.lentUntil.IsZero():
				case g.production() && h.class == ClassOpportunistic:
					q.preemptHolderLocked(h)
				default:
					q.contendHolderLocked(h)
				}
			}
			if _, ok := co.claimEndLocked(g, q); !ok {
				return nil
			}
			return co.freeHeadLocked(q)
		}
		for _, p := range []Class{ClassProduction, ClassOpportunistic} {
			if i := slices.IndexFunc(q.waiting[p], func(c *client) bool { return !outsider(g, c) }); i >= 0 {
				return q.waiting[p][i]
			}
		}
		return nil
	}
	return co.freeHeadLocked(q)
}

// freeHeadLocked is the client q grants next as no gang reserves it.
func (co *Gangs) freeHeadLocked(q *queue) *client {
	if q.nWaitingLocked() > 0 {
		// A member holding outside its gang's turn (since before its gang formed) is partial: it goes
		// after its quantum whoever waits, a gang's member included.
		for _, h := range q.holders {
			if gangOf(h) != nil {
				q.contendHolderLocked(h)
			}
		}
	}
	for _, p := range []Class{ClassProduction, ClassOpportunistic} {
		if i := slices.IndexFunc(q.waiting[p], func(c *client) bool { return gangOf(c) == nil || lentLocked(c) }); i >= 0 {
			if p == ClassOpportunistic && len(q.waiting[ClassProduction]) > 0 {
				return nil // production members wait for their gang's turn; opportunistic work waits with them
			}
			return q.waiting[p][i]
		}
	}
	return nil
}

// claimantLocked is the gang q is claimed for (reserved, its turn not started), or nil.
func (co *Gangs) claimantLocked(q *queue) *gang {
	if g := co.owner[q]; g != nil && g.state == gangClaimed {
		return g
	}
	return nil
}
