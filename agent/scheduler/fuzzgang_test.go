package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// FuzzGangs drives three GPUs sharing one Gangs with any sequence of client actions (join on a GPU
// with a gang key or none, as production or opportunistic; acquire, release, report its memory in,
// answer an eviction, leave; time passing) and checks after each: every queue's invariants (as
// FuzzQueue's: each client's fields agree with its state, no refused move, at most one holder on an
// exclusive GPU), that a GPU is reserved only for a gang whose turn is claimed or running, on all of
// its GPUs but those a running turn handed back; that a GPU reserved for a running gang is held by its members only, so no GPU is held by
// two gangs; that no gang member, in its gang's turn or holding from before its gang formed, holds
// a GPU another gang's member waits for (of its class or above) past its quantum plus grace, counted
// from its turn's start, or from the wait's start or its gang's forming when later; and that no GPU
// idles past GangIdleWindow plus gangIdleSlack while a client that could be granted waits for it
// (idleBoundLocked).
//
// The first byte picks the memory mode ((its value % 3): none, a budget of 64 MiB one holder at a
// time, or the same with holders sharing it) and whether gang "b" joins as production ((its value /
// 3) % 2). Slots 0-1 start as gang "a" on GPUs 0 and 1, 2-3 as gang "b" on GPUs 1 and 0 (crossing),
// 4 as "c" on GPU 2 and 5 with no gang on GPU 2. Each step is three bytes: op, slot, arg. Ops 0-1
// acquire arg % 48 MiB; 2 release; 3 a report with its memory in; 4 an eviction answered; 5 leave;
// 6 join a free slot on GPU arg % 3 with key "", "a", "b" or "c" ((arg / 3) % 4), production when
// (arg / 12) % 2 is 1; 7 time passing, arg * 5 ms.
func FuzzGangs(f *testing.F) {
	// crossing gangs: a runs on GPUs 0 and 1, b waits until a's quantum and grace, then runs
	f.Add([]byte{0, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 3, 0, 7, 0, 30, 2, 2, 0, 2, 3, 0, 7, 0, 30})
	// a production gang b preempts a on both GPUs; a member of b leaves
	f.Add([]byte{3, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 5, 2, 0, 7, 0, 40, 0, 0, 0})
	// a single client asks for a GPU reserved for a's turn
	f.Add([]byte{0, 5, 5, 0, 6, 5, 1, 0, 0, 0, 0, 5, 0, 7, 0, 40, 0, 1, 0})
	// gang a forms around a holder on a budget; b claims its GPU and waits for the holder to go
	f.Add([]byte{1, 5, 1, 0, 0, 0, 20, 6, 1, 4, 0, 3, 20, 3, 3, 0, 7, 0, 50, 0, 2, 20, 3, 2, 0})
	// holders sharing a budget: a fills in, b claims after it
	f.Add([]byte{2, 0, 0, 30, 3, 0, 0, 0, 1, 30, 3, 1, 0, 0, 2, 40, 0, 3, 40, 7, 0, 40, 4, 0, 0, 4, 1, 0, 3, 2, 0, 3, 3, 0})
	// a member of a running gang joins on a third GPU: the turn ends and the next reserves all three
	f.Add([]byte("0%20000&2A0"))
	// a production gang b claims GPUs 1 and 0 and waits for GPU 0's production holder: GPU 1 is lent
	f.Add([]byte{3, 5, 5, 0, 6, 5, 12, 0, 5, 0, 0, 3, 0, 5, 4, 0, 6, 4, 1, 0, 4, 0, 7, 0, 12, 7, 0, 30})
	f.Fuzz(func(t *testing.T, in []byte) {
		if err := runGangSteps(t, in); err != nil {
			t.Fatal(err)
		}
	})
}

// runGangSteps runs one FuzzGangs input and returns the first broken invariant.
func runGangSteps(t *testing.T, in []byte) error {
	if len(in) == 0 {
		return nil
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	co := NewGangs()
	var qs [3]*queue
	for i := range qs {
		cfg := GPUConfig{UUID: fmt.Sprintf("GPU-%d", i), Quantum: 100 * time.Millisecond, Grace: 50 * time.Millisecond}
		if in[0]%3 > 0 {
			cfg.Budget, cfg.Mode = 64*mib, []Mode{ModeAlways, ModeAuto}[in[0]%3-1]
		}
		qs[i] = newQueue(cfg, clock, m, logr.Discard())
		qs[i].useGangs(co, clock, m)
		qs[i].evictTimeout = time.Second
	}
	join := func(gpu int, key string, prio Class) *fakeClient {
		f := (&queueFixture{q: qs[gpu]}).joinAs(t, classSource{asked: prio})
		qs[gpu].joinGang(f.c, key)
		return f
	}
	bProd := Class((in[0] / 3) % 2)
	seen := map[any]time.Time{}
	cs := []*fakeClient{join(0, "a", 0), join(1, "a", 0), join(1, "b", bProd), join(0, "b", bProd), join(2, "c", 0), join(2, "", 0)}
	in = in[1:]
	for step := 0; len(in) >= 3; step, in = step+1, in[3:] {
		op, slot, arg := in[0]%8, int(in[1])%len(cs), uint64(in[2])
		f := cs[slot]
		q := f.c.gpu
		q.mu.Lock()
		_, joined := q.clients[f.c.id]
		epoch, res, need, target, raises := f.c.epoch, f.c.reservation, f.c.need, f.c.evictTarget, f.c.raises
		q.mu.Unlock()
		switch op {
		case 0, 1:
			q.acquire(f.c, (arg%48)*mib)
		case 2:
			q.release(f.c, epoch, res)
		case 3:
			q.usage(f.c, Message{Type: MsgUsage, Reason: UsageReport, Acks: raises, Need: need, Resident: res})
		case 4:
			q.usage(f.c, Message{Type: MsgUsage, Reason: UsageEvicted, Acks: raises, Need: res, Resident: target})
		case 5:
			q.leave(f.c)
		case 6:
			if !joined {
				cs[slot] = join(int(arg%3), []string{"", "a", "b", "c"}[(arg/3)%4], Class((arg/12)%2))
			}
		case 7:
			clock.Advance(time.Duration(arg) * 5 * time.Millisecond)
		}
		for _, c := range cs {
			if c.dropped {
				c.c.gpu.leave(c.c)
			}
		}
		if err := checkGangInvariants(co, qs[:], seen); err != nil {
			return fmt.Errorf("step %d (op %d, slot %d, arg %d): %w", step, op, slot, arg, err)
		}
	}
	return nil
}

// checkGangInvariants checks every coordinated queue's invariants and the gangs' (FuzzGangs). seen
// keeps, across the steps of one input, when each waiter (or asking gang) was first seen able to run on
// an idle GPU.
func checkGangInvariants(co *Gangs, qs []*queue, seen map[any]time.Time) error {
	co.mu.Lock()
	defer co.mu.Unlock()
	now := co.clock.Now()
	for _, q := range qs {
		if len(q.violations) > 0 {
			return fmt.Errorf("GPU %s: %w", q.uuid, errors.Join(q.violations...))
		}
		if q.exclusive() && len(q.holders) > 1 {
			return fmt.Errorf("GPU %s: %d holders on an exclusive GPU", q.uuid, len(q.holders))
		}
		for _, c := range q.clients {
			if err := q.clientInvariantLocked(c); err != nil {
				return fmt.Errorf("GPU %s: %w", q.uuid, err)
			}
		}
		if g := co.owner[q]; g != nil {
			switch {
			case co.byKey[g.key] != g || !g.isGang() || g.state == gangIdle:
				return fmt.Errorf("GPU %s reserved for gang %s (state %d, formed %v)", q.uuid, g.key, g.state, g.isGang())
			case g.state == gangRunning:
				for _, h := range q.holders {
					if outsider(g, h) {
						return fmt.Errorf("GPU %s in gang %s's turn held by client %d outside it", q.uuid, g.key, h.id)
					}
				}
			}
		}
		if err := gangBoundLocked(co, q, now); err != nil {
			return err
		}
		if err := idleBoundLocked(q, now, seen); err != nil {
			return err
		}
	}
	if err := gangIdleBoundLocked(co, now, seen); err != nil {
		return err
	}
	for _, g := range co.byKey {
		if g.state == gangIdle {
			continue
		}
		for _, q := range g.gpus() {
			if co.owner[q] != g && (g.state != gangRunning || !slices.Contains(g.lent, q)) {
				return fmt.Errorf("gang %s (state %d) does not reserve its GPU %s", g.key, g.state, q.uuid)
			}
		}
	}
	return nil
}

// gangBoundLocked: no gang member holds q while another gang's member of its class or above waits for
// q, past its quantum plus grace from its turn's start (its gang's, in its gang's turn), or past the
// grace from the wait's start or its gang's forming (a holder that became a member mid-hold), whichever
// is latest.
func gangBoundLocked(co *Gangs, q *queue, now time.Time) error {
	for _, h := range q.holders {
		g := gangOf(h)
		if g == nil {
			continue
		}
		start, quantum, grace := h.turnStart, q.quantum, q.grace
		if g.state == gangRunning && co.owner[q] == g {
			start, quantum, grace = g.turnStart, g.quantum, g.grace
		}
		for _, line := range q.waiting {
			for _, w := range line {
				o := gangOf(w)
				if o == nil || o == g || (h.class == ClassProduction && w.class == ClassOpportunistic) {
					continue
				}
				limit := start.Add(quantum)
				for _, t := range []time.Time{w.waitingSince, g.formedAt} {
					if t.After(limit) {
						limit = t
					}
				}
				if now.After(limit.Add(grace)) {
					return fmt.Errorf("GPU %s: client %d of gang %s (state %d) holds it %v past its bound while client %d of gang %s waits",
						q.uuid, h.id, g.key, g.state, now.Sub(limit.Add(grace)), w.id, o.key)
				}
			}
		}
	}
	return nil
}

// gangIdleSlack is what FuzzGangs allows past GangIdleWindow: its clock moves in steps of 5 ms.
const gangIdleSlack = 5 * time.Millisecond

// idleBoundLocked: q has no holder while a client that could be granted waits for no longer than
// GangIdleWindow plus gangIdleSlack, counted from the latest of that client's request, the last
// holder's going and the first check that saw it able to run (seen). A client could be granted unless
// it is a member of a gang whose turn has not started (it waits for its gang's other GPUs: see
// gangIdleBoundLocked) or opportunistic while production waits on q; and none is while memory
// decides (an eviction asked, or a waiter whose need does not fit, which the line waits behind), or
// while q rebuilds.
func idleBoundLocked(q *queue, now time.Time, seen map[any]time.Time) error {
	if len(q.holders) > 0 || q.rebuildingLocked() {
		return nil
	}
	for _, c := range q.clients {
		if c.evictPending || c.state == stateWaiting && q.budget > 0 && c.need > c.reservation+q.free() {
			return nil // memory decides: the line waits behind a waiter whose need does not fit
		}
	}
	var who *client
	var since time.Time
	for _, line := range q.waiting {
		for _, w := range line {
			if g := gangOf(w); g != nil && g.state != gangRunning {
				delete(seen, w)
				continue
			}
			if w.class == ClassOpportunistic && len(q.waiting[ClassProduction]) > 0 {
				delete(seen, w)
				continue
			}
			if _, ok := seen[w]; !ok {
				seen[w] = now
			}
			at := latest(w.waitingSince, q.freedAt, seen[w])
			if who == nil || at.Before(since) {
				who, since = w, at
			}
		}
	}
	if who == nil {
		return nil
	}
	if idle := now.Sub(since); idle > GangIdleWindow+gangIdleSlack {
		return fmt.Errorf("GPU %s idle for %v while client %d (%s, gang %v) waits", q.uuid, idle, who.id,
			who.class.String(), gangOf(who) != nil)
	}
	return nil
}

// gangIdleBoundLocked: a gang that asks, whose turn has not started, does not find every one of its
// GPUs without a holder for longer than GangIdleWindow plus gangIdleSlack (counted as idleBoundLocked
// does): nothing then stands between it and its turn but the gangs' own decisions. A GPU reserved for
// another gang is not idle (that gang's own turn, or its wait for a holder, bounds it), and a gang
// behind an earlier one that asks for one of its GPUs waits for that one (reservations go in one order,
// so that none starves; the first gang's wait is checked). A GPU where memory
// decides (an eviction asked, or a waiter whose need does not fit, which the GPU's line waits behind)
// is not idle. A gang that mixes classes is left out, and so is a GPU where its production member
// waits: that member, waiting for its gang's turn, keeps opportunistic work (other gangs' included) off
// the GPU while the gang, opportunistic, waits for production elsewhere (docs/qos.md). Only the
// standalone scheduler, whose classes come from each process's hello, forms one; the agent's gang is a
// pod, of one class.
func gangIdleBoundLocked(co *Gangs, now time.Time, seen map[any]time.Time) error {
	order := co.sortedLocked()
	for i, g := range order {
		stalled := g.isGang() && g.ticket != 0 && g.state != gangRunning && !mixed(g) && !behindAnother(g, order[:i])
		for _, q := range g.gpus() {
			stalled = stalled && len(q.holders) == 0 && (co.owner[q] == nil || co.owner[q] == g) &&
				!slices.ContainsFunc(mapValues(q.clients), func(c *client) bool {
					return c.evictPending || c.state == stateWaiting && q.budget > 0 && c.need > c.reservation+q.free() ||
						c.state == stateWaiting && c.class == ClassProduction && gangOf(c) != nil && mixed(gangOf(c))
				})
		}
		if !stalled {
			delete(seen, g)
			continue
		}
		if _, ok := seen[g]; !ok {
			seen[g] = now
		}
		since := latest(g.wantSince, seen[g])
		for _, q := range g.gpus() {
			since = latest(since, q.freedAt)
		}
		if idle := now.Sub(since); idle > GangIdleWindow+gangIdleSlack {
			return fmt.Errorf("gang %s (state %d, production %v) asks and all its GPUs have been idle for %v", g.key, g.state,
				g.production(), idle)
		}
	}
	return nil
}

func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

func mapValues(m map[uint32]*client) []*client {
	out := make([]*client, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	return out
}

// behindAnother: a gang before g in the reservation order asks for one of g's GPUs.
func behindAnother(g *gang, before []*gang) bool {
	for _, o := range before {
		if o.ticket != 0 && o.state != gangRunning && slices.ContainsFunc(o.gpus(), func(q *queue) bool { return slices.Contains(g.gpus(), q) }) {
			return true
		}
	}
	return false
}

// mixed: g has production and opportunistic members.
func mixed(g *gang) bool {
	return slices.ContainsFunc(g.members, func(c *client) bool { return c.class != g.members[0].class })
}
