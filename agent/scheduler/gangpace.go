package scheduler

import "slices"

// What a preempted gang leaves running.
//
// Production preempts an opportunistic gang (its members on the other GPUs keep them for the grace,
// gangpreempt.go), but a member may have launched its half of a collective (NCCL's kernels spin until
// every peer's has started): what the members queued behind it, or on their other streams, would run
// beside production's work as any preempted backlog would. So a gang's members are paced (PACE, the
// opportunistic launch queue's bound, qos.go) while production is busy on any GPU of their gang, not
// only their own: a member keeps at most that bound of launches outstanding beyond the collective
// kernels it had started, whichever GPU production took. The kernels of a collective already started
// cannot be taken back; they hold NCCL's channels (a few SMs each) until the peers run.

// productionBusyLocked: c is a gang's member and a production client is busy (busyLocked) on
// another GPU of its gang.
func (co *Gangs) productionBusyLocked(c *client) bool {
	g := gangOf(c)
	if g == nil {
		return false
	}
	for _, q := range g.gpus() {
		if q != c.gpu && q.busyClassLocked(ClassProduction) {
			return true
		}
	}
	return false
}

// peerGPUsLocked are the other GPUs of the gangs with a member on q.
func (co *Gangs) peerGPUsLocked(q *queue) []*queue {
	if !co.active() {
		return nil
	}
	var out []*queue
	for _, c := range q.clients {
		g := gangOf(c)
		if g == nil {
			continue
		}
		for _, o := range g.gpus() {
			if o != q && !slices.Contains(out, o) {
				out = append(out, o)
			}
		}
	}
	return out
}
