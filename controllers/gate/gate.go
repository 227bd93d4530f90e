// Package gate keeps a controller's concurrent API writes near what the API server can serve. A saturated
// API server answers every request late, and its latency is its queue: n writes in flight take about n
// times the service time each, while the throughput stays the same. A controller that sends more writes
// than the server can serve therefore gains nothing and makes each reconcile slow. The gate admits
// reconciles (at the work queue, so waiting for it is queue time, not reconcile time) up to a limit that
// it adapts from the latency of the writes: additive increase while writes come back within the target,
// multiplicative decrease, at most once per round trip, when they do not.
package gate

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Options tune a Gate.
type Options struct {
	// Min and Max bound the limit: Min is the concurrency kept however late writes come back, Max the
	// controller's worker count. During a rollout the agents' acks keep the API server busy between the
	// resolver's writes, so one write in flight keeps most of the throughput and answers each write sooner
	// (docs/controller.md, Write concurrency).
	Min, Max int
	// Target is the write latency the gate aims at; writes slower than it shrink the limit.
	Target time.Duration
	// Clock spaces the decreases; nil means the real clock.
	Clock clock.PassiveClock
}

// Gate is an adaptive concurrency limit.
type Gate struct {
	o    Options
	mu   sync.Mutex
	cond *sync.Cond
	// limit is fractional so that the additive increase (1/limit per fast write) adds one per round trip.
	limit        float64
	inUse        int
	waiting      int // Acquire calls waiting for a slot
	closed       bool
	lastDecrease time.Time
}

// New returns a gate starting at Min.
func New(o Options) *Gate {
	o.Min = max(o.Min, 1)
	o.Max = max(o.Max, o.Min)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	g := &Gate{o: o, limit: float64(o.Min)}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// Acquire waits for a slot; false means the gate was closed (the queue shut down).
func (g *Gate) Acquire() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.closed && g.inUse >= int(g.limit) {
		g.waiting++
		g.cond.Wait()
		g.waiting--
	}
	if g.closed {
		return false
	}
	g.inUse++
	return true
}

// Release frees a slot taken by Acquire.
func (g *Gate) Release() {
	g.mu.Lock()
	g.inUse--
	g.mu.Unlock()
	g.cond.Signal()
}

// Close wakes every waiter with false; later Acquires fail at once.
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cond.Broadcast()
}

// Observe feeds the latency of one write. A late write shrinks the limit by a quarter, but only once per
// latency: the writes that were in flight together with it are late for the same reason, and counting
// each of them would collapse the limit to Min on one slow moment.
func (g *Gate) Observe(latency time.Duration) {
	g.mu.Lock()
	grew := false
	now := g.o.Clock.Now()
	switch {
	case latency > g.o.Target:
		if now.Sub(g.lastDecrease) >= latency {
			g.limit = max(float64(g.o.Min), g.limit*0.75)
			g.lastDecrease = now
		}
	case g.inUse >= int(g.limit):
		// Only a gate used up to its limit (the caller holds one of the slots) learns that the limit can
		// grow: a fast write with slots to spare says nothing about more concurrency.
		before := int(g.limit)
		g.limit = min(float64(g.o.Max), g.limit+1/g.limit)
		grew = int(g.limit) > before
	}
	g.mu.Unlock()
	if grew {
		g.cond.Broadcast()
	}
}

// Limit is the current limit (whole slots).
func (g *Gate) Limit() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return int(g.limit)
}
