package scheduler

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// queue is the GPU of one uuid: who may run on it and how much device memory
// each client may keep physically resident. It knows nothing about sockets: a
// client is an id plus a non-blocking send and a way to drop it.
//
// Without a budget (Budget 0) it is the plain lock: one holder at a time,
// FIFO waiters in two classes, production and opportunistic (qos.go), quantum
// and revocation. With a
// budget it also keeps, per client, a reservation (bytes it may have
// resident), under the budget rule (checkBudget). A
// waiter is granted when its need fits the free budget, after evicting what
// is missing from clients that do not run (least recently run first, only
// as much as needed); in ModeAuto several clients hold at once while their
// needs fit together, in ModeAlways one at a time, in ModeOff everyone runs
// and memory that does not fit fails to allocate.
type queue struct {
	uuid    string
	quantum time.Duration
	grace   time.Duration
	budget  uint64
	mode    Mode
	serial  bool // GPUConfig.SerialHandoffs
	// production is GPUConfig.ProductionPriority (nil: no pod makes a client production), paceDepth
	// GPUConfig.OpportunisticQueue with its default (qos.go).
	production *int32
	paceDepth  uint32
	// paceTimeUS is GPUConfig.OpportunisticQueueTime in us (0: the count bound alone), settleUS
	// GPUConfig.SettleFloor in us (0: no release on completion), with their defaults (qos.go).
	paceTimeUS uint32
	settleUS   uint32
	// envOverrides is Options.EnvOverrides (Policy, liveness.go).
	envOverrides bool
	clock        Clock
	log          logr.Logger

	waitHist    prometheus.Observer
	holdHist    prometheus.Observer
	handoffs    prometheus.Counter
	revocations prometheus.Counter
	preemptions prometheus.Counter
	stalls      prometheus.Counter
	evictions   prometheus.Counter
	clientGauge prometheus.Gauge
	// droppedEvict counts clients dropped for ignoring an EVICT (deadline.go).
	droppedEvict prometheus.Counter
	evictTimeout time.Duration
	// stallBound, stopped and onStall are Guards.StallBound, the process check and
	// Guards.OnStallRevoked (stall.go); stallTimer is the next look at the holders while someone waits.
	stallBound time.Duration
	stopped    func(pid int32) bool
	onStall    func(StallRevocation)
	stallTimer Timer

	// mu is its Gangs' lock, shared by the GPUs a gang may span (gang.go).
	mu       *sync.Mutex
	gangs    *Gangs
	nextID   uint32
	epoch    uint32
	clients  map[uint32]*client
	holders  []*client // in grant order
	waiting  [2][]*client
	reserved uint64    // sum of reservations
	peak     uint64    // highest reserved ever seen
	freedAt  time.Time // when its last holder went (FuzzGangs' idle bound)
	retry    Timer     // re-dispatch after an eviction that could not free enough
	// termsTimer re-evaluates PACE and IDLE at termsAt, when a client stops counting as busy (busy.go).
	termsTimer Timer
	termsAt    time.Time
	rebuild    rebuildState
	// violations are the broken invariants seen, most recent last (violationLocked); tests fail on any.
	violations []error
}

// client is one connected shim process.
type client struct {
	id  uint32
	pid int32
	// class is what classSrc decides under the GPU's production threshold (qos.go).
	class    Class
	classSrc classSource
	version  uint16 // its protocol version; 0: the current one
	pace     uint32 // the last PACE it was sent (0 before any: unbounded)
	idle     uint32 // the last IDLE it was sent, in us (0 before any: its own window)
	paceTime uint32 // the last PACE_TIME it was sent, in us (0 before any: the count bound)
	settle   uint32 // the last SETTLE it was sent, in us (0 before any: off)
	// paceInForce and pacingState are the launch bound it last reported in force and its source
	// (Pacing, liveness.go); pacingKnown: it reported one.
	paceInForce uint32
	pacingState PacingState
	pacingKnown bool
	pings       uint64 // Pings answered
	// send queues an encoded message without blocking; false means the
	// client is not reading and must be dropped.
	send func([]byte) bool
	drop func()

	connectedAt time.Time
	// state is where it stands with the lock (state.go); only setStateLocked changes it.
	state        clientState
	waitingSince time.Time
	waits        uint64
	waitTotal    time.Duration
	holdTotal    time.Duration
	grants       uint64
	revocations  uint64
	preemptions  uint64

	// the current hold
	epoch     uint32
	grantedAt time.Time
	// turnStart is when its turn began, from which the quantum counts: the grant (or its memory's
	// arrival, restartHoldLocked) of a hold that did not resume a preempted turn. resuming: production
	// preempted its turn with quantum left, and its next hold (or the one it holds) continues that
	// turn (qos.go).
	turnStart     time.Time
	resuming      bool
	turnTimer     Timer     // the end of a preempted turn (turn.go)
	turnEnd       time.Time // when turnTimer fires
	lastBusy      time.Time // the end of its last hold (busy.go)
	contendedSent bool
	revokeTimer   Timer
	revokeAt      time.Time // when revokeTimer fires
	// stoppedSince: its process was first seen stopped then, in this hold, while someone waited
	// (stall.go); zero otherwise.
	stoppedSince time.Time
	// lentUntil: it holds a GPU claimed for a gang, lent while the gang waits for its other GPUs'
	// holders, and is revoked then (gangidle.go); zero otherwise.
	lentUntil time.Time
	lastRun   time.Time

	// memory (budget > 0)
	need         uint64 // bytes it must have resident to run
	reservation  uint64 // bytes it may have resident
	raises       uint32 // Grants and MemReply OKs sent: the acks a report must carry to lower the reservation
	evictPending bool
	evictTarget  uint64
	// evictOf and evictFor are the classes of this client and of the one its eviction made room for,
	// when it was asked (qosInvariantLocked).
	evictOf, evictFor Class
	evictTimer        Timer // the EVICT's answer deadline (deadline.go)
	noEvictUntil      time.Time
	memPending        bool
	memNeed           uint64
	evictions         uint64
	reported          Message // last Usage
	rejoined          bool    // sent its Rejoin (rebuild.go)

	// gang is its key's clients (gang.go; nil: its pod or session is unknown), gpu its queue, arrival
	// the order of its last request among every coordinated GPU's requests and gang tickets.
	gang    *gang
	gpu     *queue
	arrival uint64
}

func newQueue(cfg GPUConfig, clock Clock, m *Metrics, log logr.Logger) *queue {
	q := &queue{
		uuid:        cfg.UUID,
		quantum:     cfg.Quantum,
		grace:       cfg.Grace,
		budget:      cfg.Budget,
		mode:        cfg.Mode,
		serial:      cfg.SerialHandoffs,
		clock:       clock,
		log:         log.WithValues("gpu", cfg.UUID),
		waitHist:    m.wait.WithLabelValues(cfg.UUID),
		holdHist:    m.hold.WithLabelValues(cfg.UUID),
		handoffs:    m.handoffs.WithLabelValues(cfg.UUID),
		revocations: m.revocations.WithLabelValues(cfg.UUID),
		preemptions: m.preemptions.WithLabelValues(cfg.UUID),
		stalls:      m.stalls.WithLabelValues(cfg.UUID),
		evictions:   m.evictions.WithLabelValues(cfg.UUID),
		clientGauge: m.clients.WithLabelValues(cfg.UUID),
		clients:     map[uint32]*client{},
	}
	q.useGangs(NewGangs(), clock, m)
	q.setClassConfigLocked(cfg)
	q.droppedEvict = m.dropped.WithLabelValues(cfg.UUID, DropEvictTimeout)
	return q
}

// useGangs puts q under co, whose lock it then takes.
func (q *queue) useGangs(co *Gangs, clock Clock, m *Metrics) {
	if co.clock == nil {
		co.clock, co.metrics = clock, m
	}
	q.gangs, q.mu = co, &co.mu
}

// setClassConfigLocked takes the production threshold and the pacing depth of cfg.
func (q *queue) setClassConfigLocked(cfg GPUConfig) {
	q.production = nil
	if cfg.ProductionPriority != nil {
		v := *cfg.ProductionPriority // a copy: the caller's value may change after
		q.production = &v
	}
	q.paceDepth = cfg.OpportunisticQueue
	if q.paceDepth == 0 {
		q.paceDepth = DefaultOpportunisticQueue
	}
	q.paceTimeUS = usOrOff(cfg.OpportunisticQueueTime, DefaultOpportunisticQueueTime)
	q.settleUS = usOrOff(cfg.SettleFloor, DefaultSettleFloor)
}

// usOrOff is d in microseconds (at least 1), def's where d is 0, and 0 (off) where d is negative.
func usOrOff(d, def time.Duration) uint32 {
	switch {
	case d < 0:
		return 0
	case d == 0:
		d = def
	}
	return uint32(max(d/time.Microsecond, 1))
}

func ms(d time.Duration) uint32 { return uint32(d / time.Millisecond) }

// exclusive: one holder at a time.
func (q *queue) exclusive() bool { return q.budget == 0 || q.mode == ModeAlways }

// join registers a client of the class src gives it and queues its Welcome before anything else can
// be sent to it, then its PACE if one applies.
func (q *queue) join(pid int32, src classSource, version uint16, send func([]byte) bool, drop func()) *client {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	c := &client{id: q.nextID, pid: pid, class: q.classLocked(src), classSrc: src, version: version, send: send,
		drop: drop, connectedAt: q.clock.Now(), gpu: q}
	if src.fromPod && src.asked == ClassProduction && c.class != ClassProduction {
		q.log.V(1).Info("Shim client asked for high priority; its pod makes it opportunistic", "client", c.id,
			"pid", pid, "podPriority", src.value, "podKnown", src.known, "productionPriority", thresholdValue(q.production))
	}
	q.clients[c.id] = c
	q.clientGauge.Set(float64(len(q.clients)))
	q.sendLocked(c, Message{Type: MsgWelcome, ClientID: c.id, QuantumMS: ms(q.quantum), GraceMS: ms(q.grace),
		Mode: q.mode, Budget: q.budget})
	q.policyLocked(c)
	q.termsLocked()
	return c
}

// leave forgets a client; if it held the GPU others move on at once (the
// lease is the connection), and its memory returns to the budget.
func (q *queue) leave(c *client) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.leaveLocked(c)
}

func (q *queue) leaveLocked(c *client) {
	if _, ok := q.clients[c.id]; !ok {
		return
	}
	delete(q.clients, c.id)
	q.clientGauge.Set(float64(len(q.clients)))
	if c.state.granted() {
		q.log.V(1).Info("Holder disconnected, freeing the GPU", "client", c.id, "pid", c.pid)
		q.endHoldLocked(c)
	}
	_ = q.setStateLocked(c, stateGone) // from idle or waiting: always legal
	q.setReservationLocked(c, 0)
	c.evictPending = false
	q.stopEvictDeadlineLocked(c)
	q.gangs.leaveLocked(c)
	q.termsLocked()
	q.dispatchLocked(nil)
}

// acquire queues c with the bytes it needs resident to run.
func (q *queue) acquire(c *client, need uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state != stateIdle {
		return // it waits or holds already, or it is gone
	}
	if q.budget == 0 {
		need = 0
	} else if need > q.budget {
		q.log.Info("Dropping shim client that needs more than the GPU's budget", "client", c.id, "pid", c.pid,
			"need", need, "budget", q.budget)
		c.drop()
		return
	}
	c.need = need
	c.waitingSince = q.clock.Now()
	c.arrival = q.gangs.nextSeqLocked()
	if q.setStateLocked(c, stateWaiting) != nil {
		return
	}
	q.resumeTurnLocked(c)
	q.dispatchLocked(c)
	if c.state == stateWaiting {
		c.waits++
	}
}

// release ends c's hold of epoch; a stale epoch (after a revocation) is ignored.
func (q *queue) release(c *client, epoch uint32, resident uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !c.state.granted() || epoch != c.epoch {
		return
	}
	q.endHoldLocked(c)
	if q.budget > 0 && resident < c.reservation {
		q.setReservationLocked(c, resident)
	}
	q.dispatchLocked(nil)
}

// memReq asks to raise a holder's reservation to need (its allocations grew).
func (q *queue) memReq(c *client, need uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case !c.state.granted():
		q.sendLocked(c, Message{Type: MsgMemReply, Status: MemBusy, Resident: c.reservation})
	case q.budget == 0 || need > q.budget:
		q.sendLocked(c, Message{Type: MsgMemReply, Status: MemTooLarge, Resident: c.reservation})
	default:
		c.memPending, c.memNeed = true, need
		q.tryMemLocked(c)
		q.dispatchLocked(nil)
	}
}

// usage records a client's report; an eviction answer or a report after
// frees lowers its reservation, but only when the report was written after
// every raise the scheduler sent it.
func (q *queue) usage(c *client, m Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == stateGone {
		return // a report read before its connection ended
	}
	c.reported = m
	if m.Reason == UsageProgress && !c.evictPending {
		return // a late progress report of an eviction already answered
	}
	if m.Reason == UsageEvicted {
		if !c.evictPending {
			return
		}
		c.evictPending = false
		q.stopEvictDeadlineLocked(c)
		if m.Resident > c.evictTarget {
			// It could not free what was asked (it failed to copy out): leave it
			// alone for a moment and let the next dispatch pick others.
			c.noEvictUntil = q.clock.Now().Add(100 * time.Millisecond)
			q.armRetryLocked(100 * time.Millisecond)
		}
	}
	// A holder's report keeps what it is growing into: right after the grant for an
	// allocation, the report comes before the allocation is made (need > resident + swapped).
	keep := m.Resident
	if c.state.granted() && m.Reason == UsageReport && m.Need > m.Resident+m.Stats.Swapped {
		keep += m.Need - m.Resident - m.Stats.Swapped
	}
	if q.budget > 0 && m.Acks == c.raises && keep < c.reservation && !c.memPending {
		q.setReservationLocked(c, keep)
	}
	if c.state.granted() && m.Need < c.need {
		c.need = m.Need
	}
	if c.state == stateStarting && m.Reason == UsageReport && m.Acks == c.raises {
		// Its memory is in: the hold (and its quantum) starts now.
		q.restartHoldLocked(c)
	}
	q.dispatchLocked(nil)
}

// setReservationLocked changes c's reservation to v, if the budget rule allows it (checkBudget; a
// Rejoin's accounting passes rejoin). A change against it is a scheduler bug: refused (the shim maps
// only what its reservation allows, so memory stays within the budget), logged and counted.
func (q *queue) setReservationLocked(c *client, v uint64) { q.reserveLocked(c, v, false) }

func (q *queue) reserveLocked(c *client, v uint64, rejoin bool) {
	if err := checkBudget(q.budget, q.reserved, c.reservation, v, c.need, rejoin); err != nil {
		q.violationLocked(fmt.Errorf("client %d: %w", c.id, err))
		return
	}
	q.reserved = q.reserved - c.reservation + v
	c.reservation = v
	if q.reserved > q.peak {
		q.peak = q.reserved
	}
}

func (q *queue) free() uint64 {
	if q.reserved >= q.budget {
		return 0
	}
	return q.budget - q.reserved
}

// tryMemLocked answers a holder's pending MemReq if it can be answered now.
func (q *queue) tryMemLocked(c *client) {
	if !c.memPending {
		return
	}
	need := c.memNeed
	if need <= c.reservation {
		c.memPending = false
		c.need = need
		q.replyOKLocked(c)
		return
	}
	extra := need - c.reservation
	if extra <= q.free() {
		c.memPending = false
		c.need = need
		q.setReservationLocked(c, need)
		q.replyOKLocked(c)
		return
	}
	if q.mode == ModeOff {
		c.memPending = false
		q.sendLocked(c, Message{Type: MsgMemReply, Status: MemTooLarge, Resident: c.reservation})
		return
	}
	if q.evictLocked(extra-q.free()+q.overLocked(), c) {
		return // answered when the evictions are done
	}
	if len(q.holders) > 1 {
		// Other holders keep the memory: this one yields and waits in line with its larger need.
		c.memPending = false
		q.sendLocked(c, Message{Type: MsgMemReply, Status: MemBusy, Resident: c.reservation})
	}
	// Otherwise evictions that failed a moment ago are retried by the timer.
}

func (q *queue) replyOKLocked(c *client) {
	c.raises++
	q.sendLocked(c, Message{Type: MsgMemReply, Status: MemOK, Resident: c.reservation})
}

// evictLocked makes sure amount bytes are being freed for `forc`: evictions
// already under way count; more are asked from clients that do not run and
// whose memory may go to forc (mayEvictFor), in evictOrderLess's order, each
// only for what is still missing. False when they cannot free enough (the
// holders must yield).
func (q *queue) evictLocked(amount uint64, forc *client) bool {
	var pending uint64
	var cands []*client
	now := q.clock.Now()
	for _, o := range q.clients {
		switch {
		case o.evictPending:
			if o.reservation > o.evictTarget {
				pending += o.reservation - o.evictTarget
			}
		case o != forc && !o.state.granted() && o.reservation > 0 && !now.Before(o.noEvictUntil) && mayEvictFor(o, forc):
			cands = append(cands, o)
		}
	}
	if pending >= amount {
		return true
	}
	var avail uint64
	for _, o := range cands {
		avail += o.reservation
	}
	if pending+avail < amount {
		return pending > 0
	}
	sort.Slice(cands, func(i, j int) bool { return evictOrderLess(cands[i], cands[j]) })
	rest := amount - pending
	for _, o := range cands {
		if rest == 0 {
			break
		}
		take := min(o.reservation, rest)
		rest -= take
		o.evictPending = true
		o.evictTarget = o.reservation - take
		o.evictOf, o.evictFor = o.class, forc.class
		o.evictions++
		q.evictions.Inc()
		q.sendLocked(o, Message{Type: MsgEvict, Target: o.evictTarget})
		q.armEvictDeadlineLocked(o)
	}
	return true
}

// dispatchLocked grants what can be granted on q and, where gangs are formed, on every GPU their
// decisions touch (Gangs.settleLocked).
func (q *queue) dispatchLocked(acquirer *client) {
	if q.gangs.active() || len(q.gangs.dirty) > 0 {
		q.gangs.settleLocked(q, acquirer)
		return
	}
	q.dispatchQueueLocked(acquirer)
}

// dispatchQueueLocked grants what can be granted: opportunistic holders make way
// for production at once (preemptLocked), then holders' memory requests go
// first, then waiters in order (production first, FIFO within a class). When
// the head waiter cannot run because of the holders, they are told
// (CONTENDED) and will yield after their quantum, except production holders
// to an opportunistic waiter: it waits for their release. Where gangs are
// formed, the head is Gangs.headLocked's.
func (q *queue) dispatchQueueLocked(acquirer *client) {
	q.termsLocked() // a client that just asked is busy: its class's terms go out before a preemption
	q.preemptLocked()
	defer q.armTermsLocked() // the holds that end here count as busy for a while
	defer q.watchStallsLocked()
	defer q.capKeptTurnsLocked()
	if q.fillLocked() {
		return // freed bytes go to the holder filling in first; waiters wait until it is whole
	}
	for _, h := range q.holders {
		q.tryMemLocked(h)
	}
	for {
		head := q.headLocked()
		if q.gangs.active() {
			head = q.gangs.headLocked(q)
		}
		if head == nil || q.rebuildingLocked() {
			return
		}
		if head.class == ClassOpportunistic && q.productionHoldsLocked() {
			return // opportunistic clients run in production's idle gaps
		}
		if q.exclusive() && len(q.holders) > 0 {
			q.contendLocked()
			return
		}
		if q.exclusive() && gangOf(head) == nil && q.turnKeptLocked(head) {
			return // granted when the preempted client asks again, or its turn ends (turn.go)
		}
		if q.budget > 0 {
			if head.evictPending {
				return
			}
			var extra uint64
			if head.need > head.reservation {
				extra = head.need - head.reservation
			}
			if extra > q.free() {
				if q.evictLocked(extra-q.free()+q.overLocked(), head) {
					q.grantFillingLocked(head, head != acquirer)
					q.gangs.grantedLocked(q, head)
					return
				}
				q.contendLocked()
				return
			}
			if extra > 0 {
				q.setReservationLocked(head, head.need)
			}
		}
		if !q.grantLocked(head, head != acquirer, false) {
			return
		}
		q.gangs.grantedLocked(q, head)
	}
}

func (q *queue) headLocked() *client {
	for _, p := range []Class{ClassProduction, ClassOpportunistic} {
		if len(q.waiting[p]) > 0 {
			return q.waiting[p][0]
		}
	}
	return nil
}

func (q *queue) nWaitingLocked() int {
	return len(q.waiting[ClassProduction]) + len(q.waiting[ClassOpportunistic])
}

// grantLocked grants the waiter c the GPU; filling: before its whole need is reserved (fill.go).
// False when c could not be moved (a scheduler bug, violationLocked).
func (q *queue) grantLocked(c *client, handoff, filling bool) bool {
	to := stateRunning
	switch {
	case filling:
		to = stateFilling
	case q.budget > 0 && c.need > 0:
		to = stateStarting // its quantum starts when its memory is in (usage)
	}
	if q.setStateLocked(c, to) != nil {
		return false
	}
	now := q.clock.Now()
	q.epoch++
	c.epoch = q.epoch
	c.grantedAt = now
	if !c.resuming {
		c.turnStart = now
	}
	c.contendedSent = false
	wait := now.Sub(c.waitingSince)
	c.waitTotal += wait
	c.grants++
	q.waitHist.Observe(wait.Seconds())
	if handoff {
		q.handoffs.Inc()
	}
	if q.budget > 0 {
		c.raises++
	}
	q.sendLocked(c, Message{Type: MsgGrant, Epoch: c.epoch, QuantumMS: ms(q.quantum), Resident: c.reservation})
	return true
}

// contendLocked tells every holder someone waits (once per hold) and arms its revocation.
func (q *queue) contendLocked() {
	for _, h := range q.holders {
		q.contendHolderLocked(h)
	}
}

// contendHolderLocked tells h someone waits (once per hold) and arms its revocation.
func (q *queue) contendHolderLocked(h *client) {
	if !h.contendedSent {
		h.contendedSent = true
		q.sendLocked(h, Message{Type: MsgContended, Epoch: h.epoch, Waiters: uint32(q.nWaitingLocked())})
	}
	if h.revokeTimer == nil {
		q.armRevokeLocked(h, q.holdEndLocked(h))
	}
}

// holdEndLocked is when h, told now that someone waits, is revoked: the holder may keep its quantum,
// and always gets the grace period after learning that someone waits, to drain its GPU work and
// release. A budget holder still swapping in counts from its grant (restartHoldLocked), one resuming
// a preempted turn from that turn's start.
func (q *queue) holdEndLocked(h *client) time.Time {
	start := h.turnStart.Add(q.quantum)
	if now := q.clock.Now(); now.After(start) {
		start = now
	}
	return start.Add(q.grace)
}

// armRevokeLocked arms h's revocation at end.
func (q *queue) armRevokeLocked(h *client, end time.Time) {
	epoch := h.epoch
	h.revokeAt = end
	h.revokeTimer = q.clock.AfterFunc(end.Sub(q.clock.Now()), func() { q.revokeIfOverdue(h, epoch) })
}

func (q *queue) revokeIfOverdue(c *client, epoch uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !c.state.granted() || c.epoch != epoch {
		return // released in time; the timer lost the race
	}
	c.revokeTimer = nil
	// A gang that reserved the GPU waits for c to go, as a waiter would (an opportunistic gang never
	// reserves a GPU production holds).
	claim := q.gangs.claimantLocked(q)
	if (claim == nil || (!claim.production() && c.class == ClassProduction)) && (q.nWaitingLocked() == 0 || (c.class == ClassProduction && len(q.waiting[ClassProduction]) == 0)) {
		// Nobody to hand to (an opportunistic waiter does not make production yield; a holder that
		// became production since the contention keeps holding): re-armed when someone waits.
		return
	}
	c.revocations++
	q.revocations.Inc()
	q.log.Info("Revoking GPU lock held past quantum plus grace", "client", c.id, "pid", c.pid,
		"held", q.clock.Now().Sub(c.grantedAt), "quantum", q.quantum, "grace", q.grace)
	q.sendLocked(c, Message{Type: MsgRevoked, Epoch: c.epoch})
	q.endHoldLocked(c)
	q.dispatchLocked(nil)
}

func (q *queue) endHoldLocked(c *client) {
	if q.setStateLocked(c, stateIdle) != nil {
		return
	}
	now := q.clock.Now()
	hold := now.Sub(c.grantedAt)
	c.holdTotal += hold
	c.lastRun = now
	c.lastBusy = now
	q.holdHist.Observe(hold.Seconds())
	c.contendedSent = false
	c.resuming = false
	c.lentUntil = time.Time{}
	c.stoppedSince = time.Time{}
	if c.revokeTimer != nil {
		c.revokeTimer.Stop()
		c.revokeTimer = nil
	}
	if c.memPending {
		c.memPending = false
		q.sendLocked(c, Message{Type: MsgMemReply, Status: MemBusy, Resident: c.reservation})
	}
}

func (q *queue) armRetryLocked(d time.Duration) {
	if q.retry != nil {
		return
	}
	q.retry = q.clock.AfterFunc(d, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.retry = nil
		q.dispatchLocked(nil)
	})
}

func (q *queue) sendLocked(c *client, m Message) {
	m.Version = c.version
	b, err := Encode(m)
	if err != nil {
		q.log.Error(err, "Encoding a scheduler message", "type", m.Type)
		return
	}
	if !c.send(b) {
		q.log.Info("Dropping client that stopped reading", "client", c.id, "pid", c.pid)
		c.drop()
	}
}

// holderLocked is the first holder (the only one when exclusive), or nil.
func (q *queue) holderLocked() *client {
	if len(q.holders) == 0 {
		return nil
	}
	return q.holders[0]
}

// snapshot returns the state of every client of this GPU.
func (q *queue) snapshot() []ClientState {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	out := make([]ClientState, 0, len(q.clients))
	for _, c := range q.clients {
		r := c.reported
		s := ClientState{
			GPU:           q.uuid,
			ID:            c.id,
			PID:           c.pid,
			Class:         c.class,
			Holding:       c.state.granted(),
			Waiting:       c.state == stateWaiting,
			Waits:         c.waits,
			WaitTime:      c.waitTotal,
			HoldTime:      c.holdTotal,
			Grants:        c.grants,
			Revocations:   c.revocations,
			Preemptions:   c.preemptions,
			ConnectedAt:   c.connectedAt,
			NeedBytes:     c.need,
			ReservedBytes: c.reservation,
			ResidentBytes: r.Resident,
			SwappedBytes:  r.Stats.Swapped,
			SwapOuts:      r.Stats.SwapOuts,
			SwapIns:       r.Stats.SwapIns,
			BytesOut:      r.Stats.BytesOut,
			BytesIn:       r.Stats.BytesIn,
			SwapTime:      time.Duration(r.Stats.SwapNS),
			Evictions:     c.evictions,
			PacingKnown:   c.pacingKnown,
			LaunchBound:   c.paceInForce,
			PacingState:   c.pacingState,
			Pings:         c.pings,
		}
		if g := gangOf(c); g != nil {
			s.Gang = g.key
		}
		if s.Holding {
			s.HoldTime += now.Sub(c.grantedAt)
		}
		if c.state == stateWaiting {
			s.WaitTime += now.Sub(c.waitingSince)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// gpuState is the GPU-wide memory account.
func (q *queue) gpuState() GPUState {
	q.mu.Lock()
	defer q.mu.Unlock()
	var prod *int32
	if q.production != nil {
		v := *q.production
		prod = &v
	}
	return GPUState{GPU: q.uuid, Quantum: q.quantum, Grace: q.grace, Budget: q.budget, Mode: q.mode, ReservedBytes: q.reserved,
		PeakReservedBytes: q.peak, Holders: len(q.holders), Waiters: q.nWaitingLocked(),
		ProductionPriority: prod, OpportunisticQueue: q.paceDepth,
		OpportunisticQueueTime: time.Duration(q.paceTimeUS) * time.Microsecond,
		SettleFloor:            time.Duration(q.settleUS) * time.Microsecond}
}

// reconfigure takes new settings (Scheduler.Reconfigure says what each one
// changes for connected clients) and hands out what they now allow.
func (q *queue) reconfigure(cfg GPUConfig) {
	q.mu.Lock()
	defer q.mu.Unlock()
	flip := (q.budget == 0) != (cfg.Budget == 0)
	q.quantum, q.grace, q.budget, q.mode = cfg.Quantum, cfg.Grace, cfg.Budget, cfg.Mode
	q.setClassConfigLocked(cfg)
	q.log.Info("Reconfigured GPU lock", "quantum", q.quantum, "grace", q.grace, "budget", q.budget, "mode", q.mode,
		"productionPriority", thresholdValue(q.production), "opportunisticQueue", q.paceDepth, "droppedClients", flip && len(q.clients) > 0)
	if flip {
		for _, c := range q.clients {
			c.drop()
		}
		return
	}
	q.reclassifyLocked()
	q.termsLocked()
	q.dispatchLocked(nil)
}
