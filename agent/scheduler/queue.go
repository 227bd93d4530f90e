package scheduler

import (
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// queue is the lock of one GPU: at most one holder, FIFO waiters in two
// priority classes. It knows nothing about sockets: a client is an id plus
// a non-blocking send and a way to drop it.
type queue struct {
	uuid    string
	quantum time.Duration
	grace   time.Duration
	clock   Clock
	log     logr.Logger

	waitHist    prometheus.Observer
	holdHist    prometheus.Observer
	handoffs    prometheus.Counter
	revocations prometheus.Counter
	clientGauge prometheus.Gauge

	mu            sync.Mutex
	nextID        uint32
	epoch         uint32
	clients       map[uint32]*client
	holder        *client
	grantedAt     time.Time
	contendedSent bool
	waiting       [2][]*client // indexed by Priority
	revokeTimer   Timer
}

// client is one connected shim process.
type client struct {
	id       uint32
	pid      int32
	priority Priority
	// send queues an encoded message without blocking; false means the
	// client is not reading and must be dropped.
	send func([]byte) bool
	drop func()

	connectedAt  time.Time
	waiting      bool
	waitingSince time.Time
	waits        uint64
	waitTotal    time.Duration
	holdTotal    time.Duration
	grants       uint64
	revocations  uint64
}

func newQueue(cfg GPUConfig, clock Clock, m *metrics, log logr.Logger) *queue {
	return &queue{
		uuid:        cfg.UUID,
		quantum:     cfg.Quantum,
		grace:       cfg.Grace,
		clock:       clock,
		log:         log.WithValues("gpu", cfg.UUID),
		waitHist:    m.wait.WithLabelValues(cfg.UUID),
		holdHist:    m.hold.WithLabelValues(cfg.UUID),
		handoffs:    m.handoffs.WithLabelValues(cfg.UUID),
		revocations: m.revocations.WithLabelValues(cfg.UUID),
		clientGauge: m.clients.WithLabelValues(cfg.UUID),
		clients:     map[uint32]*client{},
	}
}

func ms(d time.Duration) uint32 { return uint32(d / time.Millisecond) }

// join registers a client and queues its Welcome before anything else can be sent to it.
func (q *queue) join(pid int32, prio Priority, send func([]byte) bool, drop func()) *client {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	c := &client{id: q.nextID, pid: pid, priority: prio, send: send, drop: drop, connectedAt: q.clock.Now()}
	q.clients[c.id] = c
	q.clientGauge.Set(float64(len(q.clients)))
	q.sendLocked(c, Message{Type: MsgWelcome, ClientID: c.id, QuantumMS: ms(q.quantum), GraceMS: ms(q.grace)})
	return c
}

// leave forgets a client; if it held the lock the lock moves on at once (the lease is the connection).
func (q *queue) leave(c *client) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.clients[c.id]; !ok {
		return
	}
	delete(q.clients, c.id)
	q.clientGauge.Set(float64(len(q.clients)))
	q.removeWaiterLocked(c)
	if q.holder == c {
		q.log.V(1).Info("Holder disconnected, freeing the GPU lock", "client", c.id, "pid", c.pid)
		q.endHoldLocked()
		q.handoffLocked()
	}
}

func (q *queue) acquire(c *client) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.holder == c || c.waiting {
		return
	}
	now := q.clock.Now()
	c.waiting = true
	c.waitingSince = now
	if q.holder == nil {
		q.grantLocked(c, false)
		return
	}
	c.waits++
	q.waiting[c.priority] = append(q.waiting[c.priority], c)
	q.contendLocked()
}

// release ends c's hold of epoch; a stale epoch (after a revocation) is ignored.
func (q *queue) release(c *client, epoch uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.holder != c || epoch != q.epoch {
		return
	}
	q.endHoldLocked()
	q.handoffLocked()
}

func (q *queue) nWaitingLocked() int {
	return len(q.waiting[PriorityHigh]) + len(q.waiting[PriorityNormal])
}

func (q *queue) grantLocked(c *client, handoff bool) {
	now := q.clock.Now()
	q.epoch++
	q.holder = c
	q.grantedAt = now
	q.contendedSent = false
	wait := now.Sub(c.waitingSince)
	c.waiting = false
	c.waitTotal += wait
	c.grants++
	q.waitHist.Observe(wait.Seconds())
	if handoff {
		q.handoffs.Inc()
	}
	q.sendLocked(c, Message{Type: MsgGrant, Epoch: q.epoch, QuantumMS: ms(q.quantum)})
	if q.nWaitingLocked() > 0 {
		q.contendLocked()
	}
}

// contendLocked tells the holder someone waits (once per hold) and arms revocation.
func (q *queue) contendLocked() {
	if q.holder == nil {
		return
	}
	if !q.contendedSent {
		q.contendedSent = true
		q.sendLocked(q.holder, Message{Type: MsgContended, Epoch: q.epoch, Waiters: uint32(q.nWaitingLocked())})
	}
	if q.revokeTimer == nil {
		// The holder may keep its quantum, and always gets the grace period
		// after learning that someone waits, to drain its GPU work and release.
		epoch := q.epoch
		now := q.clock.Now()
		start := q.grantedAt.Add(q.quantum)
		if now.After(start) {
			start = now
		}
		d := start.Add(q.grace).Sub(now)
		q.revokeTimer = q.clock.AfterFunc(d, func() { q.revokeIfOverdue(epoch) })
	}
}

func (q *queue) revokeIfOverdue(epoch uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.holder == nil || q.epoch != epoch {
		return // released in time; the timer lost the race
	}
	q.revokeTimer = nil
	if q.nWaitingLocked() == 0 {
		return // nobody to hand to: keep holding, re-armed when someone waits
	}
	c := q.holder
	c.revocations++
	q.revocations.Inc()
	q.log.Info("Revoking GPU lock held past quantum plus grace", "client", c.id, "pid", c.pid,
		"held", q.clock.Now().Sub(q.grantedAt), "quantum", q.quantum, "grace", q.grace)
	q.sendLocked(c, Message{Type: MsgRevoked, Epoch: q.epoch})
	q.endHoldLocked()
	q.handoffLocked()
}

func (q *queue) endHoldLocked() {
	c := q.holder
	hold := q.clock.Now().Sub(q.grantedAt)
	c.holdTotal += hold
	q.holdHist.Observe(hold.Seconds())
	q.holder = nil
	if q.revokeTimer != nil {
		q.revokeTimer.Stop()
		q.revokeTimer = nil
	}
}

// handoffLocked grants the lock to the next waiter: high priority first, FIFO within a class.
func (q *queue) handoffLocked() {
	for _, p := range []Priority{PriorityHigh, PriorityNormal} {
		if len(q.waiting[p]) > 0 {
			next := q.waiting[p][0]
			q.waiting[p] = q.waiting[p][1:]
			q.grantLocked(next, true)
			return
		}
	}
}

func (q *queue) removeWaiterLocked(c *client) {
	if !c.waiting {
		return
	}
	c.waiting = false
	w := q.waiting[c.priority]
	for i := range w {
		if w[i] == c {
			q.waiting[c.priority] = append(w[:i:i], w[i+1:]...)
			return
		}
	}
}

func (q *queue) sendLocked(c *client, m Message) {
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

// snapshot returns the state of every client of this GPU.
func (q *queue) snapshot() []ClientState {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	out := make([]ClientState, 0, len(q.clients))
	for _, c := range q.clients {
		s := ClientState{
			GPU:         q.uuid,
			ID:          c.id,
			PID:         c.pid,
			Priority:    c.priority,
			Holding:     q.holder == c,
			Waiting:     c.waiting,
			Waits:       c.waits,
			WaitTime:    c.waitTotal,
			HoldTime:    c.holdTotal,
			Grants:      c.grants,
			Revocations: c.revocations,
			ConnectedAt: c.connectedAt,
		}
		if s.Holding {
			s.HoldTime += now.Sub(q.grantedAt)
		}
		if c.waiting {
			s.WaitTime += now.Sub(c.waitingSince)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
