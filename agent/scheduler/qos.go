package scheduler

import (
	"fmt"
	"slices"
	"time"
)

// Production and opportunistic clients (docs/shim.md, "Production and opportunistic clients").
//
// A GPU serves two classes: production (ClassProduction) and opportunistic. A lock that
// only ordered its waiters would make production wait for an opportunistic holder's quantum and the
// backlog of its queued work, so production preempts: it is granted in the same dispatch and every
// opportunistic holder is sent REVOKED (no quantum, no grace). Opportunistic work never makes
// production yield, never takes production memory, and runs in production's gaps (IDLE and SETTLE,
// busy.go) with a bounded launch queue (PACE and PACE_TIME, busy.go); a preempted holder keeps the rest
// of its turn (turn.go). A client hears PACE, IDLE, SETTLE and PACE_TIME only when their value changes
// for it, and only from version 4, 5 and 7 on: an older shim takes an unknown type as a protocol error.
// The class comes from the pod (Options.PodPriority against GPUConfig.ProductionPriority), because
// the hello's priority is the pod's own word; without Options.PodPriority (the standalone scheduler,
// tests) the hello decides.

// DefaultOpportunisticQueue is the launches an opportunistic client may keep outstanding while a
// production client is busy, when GPUConfig.OpportunisticQueue is 0: the largest bound that kept
// production's p99 within its target (docs/qos.md, Results, the opportunistic queue). It is also the
// default of a policy's sharing.qos.opportunisticQueue: the agent leaves an unset queue 0.
const DefaultOpportunisticQueue = 3

// DefaultOpportunisticQueueTime is the GPU time an opportunistic client may keep outstanding while a
// production client is busy (PACE_TIME), when GPUConfig.OpportunisticQueueTime is 0. Production's wait
// at a new request is at most this plus the trainer's kernel running then (docs/qos.md); 500 us is a
// third of a graph-replayed ResNet-50 request of batch 8 on an H100, and several of a training step's
// longest convolutions, so that the trainer's CPU still runs ahead of its GPU.
const DefaultOpportunisticQueueTime = 500 * time.Microsecond

// DefaultSettleFloor is how long a production client waits without a GPU call, its submitted work
// complete, before it releases while an opportunistic client is busy (SETTLE), when
// GPUConfig.SettleFloor is 0. An eager model launches a kernel every few to tens of microseconds and
// its GPU often drains between two of them: a shorter floor would hand the GPU over (and take it back
// at once, with the trainer's queue in the way) inside a request, where a gap between requests is
// milliseconds and this floor a small part of it.
const DefaultSettleFloor = 100 * time.Microsecond

// ProductionIdle is the idle window of a production client while an opportunistic client is busy:
// between two requests an inference server releases after this long, so its gaps go to opportunistic
// work, and takes the GPU back at once at its next request (preemption). The shim's own default, 50 ms,
// would keep the GPU through most of those gaps; a shorter window leaves the trainer's queued kernels in
// production's way at each hand-off (docs/qos.md, Results, production's idle window).
const ProductionIdle = time.Millisecond

// classSource is what decides a client's class, kept for the life of its connection so that a new
// production threshold (Reconfigure) can classify it again: a pod's priority never changes.
type classSource struct {
	asked   Class // what its hello asked
	fromPod bool  // Options.PodPriority is set: the pod decides and the hello is ignored
	value   int32 // its pod's resolved priority
	known   bool  // its pod was found
}

// classLocked is the class src gives under the GPU's production threshold.
func (q *queue) classLocked(src classSource) Class {
	if !src.fromPod {
		return src.asked
	}
	if q.production != nil && src.known && src.value >= *q.production {
		return ClassProduction
	}
	return ClassOpportunistic
}

// productionHoldsLocked: a production client is granted.
func (q *queue) productionHoldsLocked() bool {
	return slices.ContainsFunc(q.holders, func(h *client) bool { return h.class == ClassProduction })
}

// preemptLocked revokes every opportunistic holder at once while a production client waits or holds.
// The revoked client becomes idle, keeping its reservation until a production need evicts it.
func (q *queue) preemptLocked() {
	if len(q.waiting[ClassProduction]) == 0 && !q.productionHoldsLocked() {
		return
	}
	for _, h := range slices.Clone(q.holders) {
		if h.class == ClassOpportunistic {
			q.preemptHolderLocked(h)
		}
	}
}

// preemptHolderLocked revokes the opportunistic holder h at once for production; it keeps its turn.
func (q *queue) preemptHolderLocked(h *client) {
	h.preemptions++
	q.preemptions.Inc()
	// V(1): production takes the GPU every time it comes back from an idle gap.
	q.log.V(1).Info("Preempting opportunistic holder for a production client", "client", h.id, "pid", h.pid,
		"held", q.clock.Now().Sub(h.grantedAt))
	q.sendLocked(h, Message{Type: MsgRevoked, Epoch: h.epoch})
	q.endHoldLocked(h)
	q.keepTurnLocked(h)
}

// mayEvictFor: o's memory may be evicted for forc. Production memory is never evicted for an
// opportunistic client, nor the memory of a preempted turn for another opportunistic client's
// (turn.go).
func mayEvictFor(o, forc *client) bool {
	switch {
	case forc == nil || forc.class == ClassProduction:
		return true
	case o.class == ClassProduction:
		return false
	}
	return !o.resuming || forc.resuming
}

// evictOrderLess orders eviction candidates: opportunistic before production (production keeps its
// memory resident as long as anything else can make room), then least recently run first.
func evictOrderLess(a, b *client) bool {
	if a.class != b.class {
		return a.class == ClassOpportunistic
	}
	if !a.lastRun.Equal(b.lastRun) {
		return a.lastRun.Before(b.lastRun)
	}
	return a.id < b.id
}

// reclassifyLocked applies the GPU's production threshold to every connected client. A waiter moves
// to its new class's line at the place its waitingSince gives it (behind the turns being resumed); a
// holder keeps its hold, and its class decides what happens next (the dispatch that follows preempts
// an opportunistic holder beside a production one).
func (q *queue) reclassifyLocked() {
	for _, c := range q.clients {
		p := q.classLocked(c.classSrc)
		if p == c.class {
			continue
		}
		q.log.Info("Shim client changes class with the production threshold", "client", c.id, "pid", c.pid,
			"from", c.class.String(), "to", p.String())
		if !c.state.granted() {
			c.resuming = false // a production client has no turn to resume; an old one is not kept
		}
		if c.state != stateWaiting {
			c.class = p
			continue
		}
		q.waiting[c.class] = slices.DeleteFunc(q.waiting[c.class], func(w *client) bool { return w == c })
		c.class = p
		line := q.waiting[p]
		i := len(line)
		for i > 0 && line[i-1].waitingSince.After(c.waitingSince) && !line[i-1].resuming {
			i--
		}
		q.waiting[p] = slices.Insert(line, i, c)
	}
}

// paces: the client understands PACE.
func (c *client) paces() bool { return c.version == 0 || c.version >= 4 }

// paceWantLocked is the bound c should be running under (0: unbounded, which a client starts with).
func (q *queue) paceWantLocked(c *client, production bool) uint32 {
	if !c.paces() || !production || c.class != ClassOpportunistic {
		return 0
	}
	return q.paceDepth
}

// paceTimes: the client understands PACE_TIME and SETTLE.
func (c *client) paceTimes() bool { return c.version == 0 || c.version >= 7 }

// paceTimeWantLocked is the GPU-time bound c should be running under, in us (0: the count bound).
func (q *queue) paceTimeWantLocked(c *client, production bool) uint32 {
	if !c.paceTimes() || q.paceWantLocked(c, production) == 0 {
		return 0
	}
	return q.paceTimeUS
}

// settleWantLocked is the floor after which c releases once its work completed, in us (0: off), under
// the same terms as its short idle window.
func (q *queue) settleWantLocked(c *client, opportunistic bool) uint32 {
	if !c.paceTimes() || q.idleWantLocked(c, opportunistic) == 0 {
		return 0
	}
	return q.settleUS
}

// idles: the client understands IDLE.
func (c *client) idles() bool { return c.version == 0 || c.version >= 5 }

// idleWantLocked is the idle window c should be running under, in microseconds (0: its own, which a
// client starts with). A production client alone with other production clients keeps its own: a
// release after 1 ms idle would cost it a hand-off at most of its requests and give nobody anything.
func (q *queue) idleWantLocked(c *client, opportunistic bool) uint32 {
	if !c.idles() || !opportunistic || c.class != ClassProduction {
		return 0
	}
	return uint32(ProductionIdle / time.Microsecond)
}

// termsLocked sends PACE and IDLE to every connected client whose bound or window changed: the
// opportunistic clients' bound when the first production client connects or the last one leaves, or
// when the depth changes; the production clients' window when the first opportunistic client
// connects or the last one leaves; a client whose class changed, either way (a client that became
// production gets PACE 0, so that a bound it ran under as opportunistic does not throttle it now, and
// one that became opportunistic IDLE 0).
//
// A gang's member is paced while production is busy on any of its gang's GPUs (gangpace.go), so
// the other GPUs of a gang whose member is here take their terms again too.
func (q *queue) termsLocked() {
	q.ownTermsLocked()
	for _, o := range q.gangs.peerGPUsLocked(q) {
		o.ownTermsLocked()
	}
}

// ownTermsLocked is termsLocked for q's own clients.
func (q *queue) ownTermsLocked() {
	production, opportunistic := q.busyClassLocked(ClassProduction), q.busyClassLocked(ClassOpportunistic)
	defer q.armTermsLocked()
	for _, c := range q.clients {
		prod := production || q.gangs.productionBusyLocked(c)
		// PACE_TIME before PACE: a shim that gets a bound applies its unit from the start.
		if want := q.paceTimeWantLocked(c, prod); want != c.paceTime {
			c.paceTime = want
			q.sendLocked(c, Message{Type: MsgPaceTime, QueueUS: want})
		}
		if want := q.paceWantLocked(c, prod); want != c.pace {
			c.pace = want
			q.sendLocked(c, Message{Type: MsgPace, MaxQueued: want})
		}
		if want := q.settleWantLocked(c, opportunistic); want != c.settle {
			c.settle = want
			q.sendLocked(c, Message{Type: MsgSettle, FloorUS: want})
		}
		if want := q.idleWantLocked(c, opportunistic); want != c.idle {
			c.idle = want
			q.sendLocked(c, Message{Type: MsgIdle, IdleUS: want})
		}
	}
}

// qosInvariantLocked is clientInvariantLocked's part about classes, for a connected client.
func (q *queue) qosInvariantLocked(c *client) error {
	switch {
	case c.class != q.classLocked(c.classSrc):
		return fmt.Errorf("client %d is %s, its pod and the threshold make it %s", c.id, c.class.String(),
			q.classLocked(c.classSrc).String())
	case c.state.granted() && c.class == ClassOpportunistic && (len(q.waiting[ClassProduction]) > 0 || q.productionHoldsLocked()):
		return fmt.Errorf("opportunistic client %d %v while a production client waits or holds", c.id, c.state)
	case c.resuming && c.class != ClassOpportunistic && !c.state.granted():
		return fmt.Errorf("production client %d keeps a preempted turn", c.id)
	case c.state == stateWaiting && c.class == ClassOpportunistic && !q.resumingFirstLocked():
		return fmt.Errorf("opportunistic line %v: a waiter resuming a preempted turn behind one that is not, or behind a later turn",
			clientIDs(q.waiting[ClassOpportunistic]))
	case c.resuming && c.state == stateIdle && c.turnTimer == nil:
		return fmt.Errorf("client %d keeps a preempted turn with no end armed", c.id)
	case c.evictPending && c.evictOf == ClassProduction && c.evictFor == ClassOpportunistic:
		return fmt.Errorf("production client %d asked to evict for an opportunistic client", c.id)
	case c.pace != q.paceWantLocked(c, q.busyClassLocked(ClassProduction) || q.gangs.productionBusyLocked(c)):
		return fmt.Errorf("client %d (version %d, %s) paced at %d, want %d", c.id, c.version, c.class.String(),
			c.pace, q.paceWantLocked(c, q.busyClassLocked(ClassProduction) || q.gangs.productionBusyLocked(c)))
	case c.paceTime != q.paceTimeWantLocked(c, q.busyClassLocked(ClassProduction) || q.gangs.productionBusyLocked(c)):
		return fmt.Errorf("client %d (version %d, %s) paced at %d us of GPU time, want %d", c.id, c.version,
			c.class.String(), c.paceTime,
			q.paceTimeWantLocked(c, q.busyClassLocked(ClassProduction) || q.gangs.productionBusyLocked(c)))
	case c.settle != q.settleWantLocked(c, q.busyClassLocked(ClassOpportunistic)):
		return fmt.Errorf("client %d (version %d, %s) told a settle floor of %d us, want %d", c.id, c.version,
			c.class.String(), c.settle, q.settleWantLocked(c, q.busyClassLocked(ClassOpportunistic)))
	case c.idle != q.idleWantLocked(c, q.busyClassLocked(ClassOpportunistic)):
		return fmt.Errorf("client %d (version %d, %s) told an idle window of %d us, want %d", c.id, c.version,
			c.class.String(), c.idle, q.idleWantLocked(c, q.busyClassLocked(ClassOpportunistic)))
	}
	return q.busyInvariantLocked(c)
}

// clientIDs are cs's ids, for a message.
func clientIDs(cs []*client) []uint32 {
	ids := make([]uint32, len(cs))
	for i, c := range cs {
		ids[i] = c.id
	}
	return ids
}

// thresholdValue is a production threshold as a log value.
func thresholdValue(p *int32) any {
	if p == nil {
		return "none"
	}
	return *p
}
