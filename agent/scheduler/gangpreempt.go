package scheduler

// A preempted gang's collectives.
//
// Production preempts an opportunistic gang's turn when it asks for one of the gang's GPUs. A member
// there may have launched its half of a collective (NCCL's kernels spin until every peer's has
// started) while a peer on another GPU had not launched its own yet. Revoking that peer too would
// leave the launched half spinning beside production until the gang's next turn, bounded by nothing.
// So the turn ends at once on the GPUs production asks for or holds, and the members holding the
// gang's other GPUs keep them for the grace (the gang's, the least of its GPUs'): time to launch their
// halves, so the collective finishes and the preempted member's release with it. They are paced
// meanwhile, as every member is while production is busy on a GPU of its gang (gangpace.go). Then
// they are revoked, whoever waits; sooner where they release, where a member leaves (the collective
// cannot finish without it), or where the queue preempts them for a production client of their own
// GPU. A new turn of the gang before then takes their holds in.

// preemptTurnLocked ends g's turn for production, keeping its members on the GPUs production does not
// ask for (or hold) granted for the grace.
func (co *Gangs) preemptTurnLocked(g *gang) {
	var keep []*client
	if g.state == gangRunning {
		for _, c := range g.members {
			if c.state.granted() && !co.yieldsOnLocked(g, c.gpu) {
				keep = append(keep, c)
			}
		}
	}
	co.endTurnLocked(g, gangEndPreempted, keep...)
	if len(keep) == 0 {
		return
	}
	co.stopLingerLocked(g)
	g.lingering = make(map[*client]uint32, len(keep))
	for _, c := range keep {
		g.lingering[c] = c.epoch
	}
	g.lingerGen++
	gen := g.lingerGen
	g.linger = co.clock.AfterFunc(g.grace, func() {
		co.mu.Lock()
		defer co.mu.Unlock()
		if g.lingerGen != gen || g.lingering == nil {
			return
		}
		g.linger = nil
		co.endLingerLocked(g)
		co.settleLocked(nil, nil)
	})
}

// endLingerLocked revokes g's members still holding from its preempted turn.
func (co *Gangs) endLingerLocked(g *gang) {
	kept := g.lingering
	co.stopLingerLocked(g)
	for c, epoch := range kept {
		if !c.state.granted() || c.epoch != epoch {
			continue // released meanwhile, or holding on a grant of its own since
		}
		q := c.gpu
		c.preemptions++
		q.preemptions.Inc()
		q.sendLocked(c, Message{Type: MsgRevoked, Epoch: c.epoch})
		q.endHoldLocked(c)
		co.markLocked(q, nil)
	}
}

// stopLingerLocked forgets g's kept members without revoking them (a new turn takes their holds in).
func (co *Gangs) stopLingerLocked(g *gang) {
	if g.linger != nil {
		g.linger.Stop()
		g.linger = nil
	}
	g.lingering = nil
}
