package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// FuzzQueue drives one GPU's queue with any sequence of client actions (join as production or
// opportunistic, re-announce, acquire, release, grow, report, answer or ignore an eviction, leave, act
// after leaving, time passing, the budget or the production threshold reconfigured) and checks its
// invariants after each: every client's state agrees with its fields and moved only along
// clientTransitions, no move was refused and no reservation changed against the budget rule
// (checkBudget), the reserved sum equals the sum of the reservations and stays within the budget (a
// sum above it, after a re-announcement or a lowered budget, only falls), an exclusive GPU has at
// most one holder, and the holder and waiting lists are the granted and waiting clients. For the
// classes (qos.go): each client is of the class its pod and the threshold give it, no opportunistic
// client holds while a production one waits or holds, no production client was asked to evict for an
// opportunistic one, each runs under the PACE and IDLE it should (by which class is busy: busy.go),
// PACE reached only version 4 clients, never repeating a value, and a client that counts as busy
// only for its recent activity has the terms' re-evaluation armed by the time it stops counting. For
// preempted turns (turn.go): the waiters resuming one lead the opportunistic line, oldest turn first,
// an idle client keeping one has its end armed, and no later than KeptTurnIdle ahead while the GPU is
// free of production. The seeds run in every `go test`.
//
// The first byte picks the mode (its value % 4: Auto, Always, Off, or no budget) and where classes
// come from ((its value / 4) % 2: the hello, or pods of priority 0, 100 and 200 under a threshold of
// 100). Each step is three bytes: op, client, arg. Ops 0-1 acquire arg MiB; 2 release; 3 MemReq arg MiB;
// 4 a periodic report of arg MiB, acks up to date or stale (arg >= 128: need arg-128 MiB with more
// resident, acks up to date); 5 an eviction answered, failed or in progress; 6 leave; 7 join a
// client in a free slot (its hello asks arg % 2; its pod's priority is 100 * (arg % 3), unknown when
// arg % 7 is 6; arg >= 128: it then re-announces arg-128 MiB; on a connected client, a
// re-announcement, refused after other messages); 8-9 time passing (op 9 with arg >= 240: the
// budget reconfigured to (arg-239)*8 MiB); 10 the production threshold reconfigured to none, 0,
// 100, 200 or 300 (arg % 5) and the opportunistic queue to arg % 3 (0: the default). A client that
// left keeps acting until its slot is joined again: its messages were read before its connection's
// end was noticed.
func FuzzQueue(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 40, 1, 1, 40, 8, 0, 200, 2, 0, 0})
	f.Add([]byte{1, 0, 0, 1, 0, 60, 1, 1, 30, 5, 0, 0, 8, 0, 250, 8, 0, 250, 1, 2, 10})
	f.Add([]byte{2, 0, 0, 1, 0, 20, 1, 1, 20, 1, 2, 20, 3, 0, 50, 3, 1, 60, 6, 0, 0})
	f.Add([]byte{3, 0, 0, 1, 0, 0, 1, 1, 0, 8, 0, 255, 8, 0, 255, 2, 1, 0})
	// an overlapped hand-off: a releases, b is granted while a's eviction reports progress
	f.Add([]byte{1, 0, 0, 40, 4, 0, 40, 0, 1, 40, 2, 0, 40, 5, 0, 1, 5, 0, 1, 5, 0, 2, 4, 1, 40})
	// the same with the newcomer a version 2 client (cs[3])
	f.Add([]byte{1, 0, 0, 40, 4, 0, 40, 0, 3, 40, 2, 0, 40, 5, 0, 1, 5, 0, 2, 4, 3, 40})
	// classes from pods: an opportunistic holder (cs[0]) preempted by production (cs[1]) on a full
	// budget, evicted while production fills in; production releases, the opportunistic one comes back
	f.Add([]byte{4, 0, 0, 40, 4, 0, 40, 0, 1, 40, 5, 0, 1, 5, 0, 2, 4, 1, 40, 2, 1, 40, 0, 0, 40, 8, 0, 30})
	// the threshold moved under waiters and holders: nobody, everyone known, then no threshold
	f.Add([]byte{5, 0, 0, 10, 0, 3, 10, 10, 0, 4, 0, 1, 10, 0, 2, 10, 10, 0, 1, 8, 0, 50, 6, 1, 0, 10, 0, 0, 8, 0, 50})
	// PACE: production leaves and joins again, the depth changes, opportunistic clients come and go
	f.Add([]byte{7, 6, 1, 0, 6, 2, 0, 10, 0, 2, 7, 1, 1, 10, 0, 7, 6, 0, 0, 7, 0, 4, 0, 0, 0, 0, 1, 0, 9, 0, 20})
	// busy, not connected: production holds, releases, and its terms lapse after RecentActivity
	f.Add([]byte{4, 0, 1, 0, 2, 1, 0, 8, 0, 255, 8, 0, 255, 8, 0, 255, 8, 0, 255, 0, 0, 10})
	// a preempted turn not taken up ends KeptTurnIdle after production released
	f.Add([]byte{4, 0, 0, 10, 8, 0, 2, 0, 1, 0, 2, 1, 0, 8, 0, 4, 8, 0, 10, 0, 3, 10})
	for _, seed := range fuzzQueueSeeds {
		f.Add(seed.in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if err := runQueueSteps(t, in); err != nil {
			t.Fatal(err)
		}
	})
}

// fuzzQueueSeeds are FuzzQueue inputs that once found a bug, or pin a case named in a design note.
var fuzzQueueSeeds = []struct {
	name string
	in   []byte
}{
	// A filling holder whose reported need drops below its reservation: a runs and releases 40 MiB
	// of 64, b (40 MiB) is granted the free 24 MiB and fills while a is evicted; b's report says
	// 10 MiB needed, 20 resident. Its reservation falls to 20 and must not rise again: the filling
	// computed need - reservation unsigned and handed b the freed 4 MiB, beyond its need.
	{"filling holder's need drops below its reservation",
		[]byte{0, 0, 0, 40, 4, 0, 40, 2, 0, 40, 0, 1, 40, 4, 1, 138, 5, 0, 2, 4, 1, 10, 2, 1, 10}},
	// A client dropped for ignoring its EVICT (the deadline leaves it at once) whose Acquire was
	// already read: it must not be queued, granted or given a reservation after it left.
	{"acquire after the scheduler dropped the client",
		[]byte{0, 0, 0, 40, 4, 0, 40, 2, 0, 40, 0, 1, 40, 8, 0, 101, 0, 0, 30, 2, 1, 40, 0, 2, 50}},
	// Re-announced memory beyond the budget, then a lowered budget: the excess only falls.
	{"rejoins above the budget, then a lower budget",
		[]byte{0, 7, 0, 0, 6, 0, 0, 7, 0, 168, 6, 1, 0, 7, 1, 168, 0, 2, 8, 5, 0, 2, 5, 1, 2, 9, 0, 243, 4, 2, 8}},
}

// TestQueueRegressions runs each of fuzzQueueSeeds as its own named test.
func TestQueueRegressions(t *testing.T) {
	for _, seed := range fuzzQueueSeeds {
		t.Run(seed.name, func(t *testing.T) {
			if err := runQueueSteps(t, seed.in); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// runQueueSteps runs one FuzzQueue input and returns the first broken invariant.
func runQueueSteps(t *testing.T, in []byte) error {
	if len(in) == 0 {
		return nil
	}
	const budget = 64 * mib
	cfg := GPUConfig{UUID: "GPU-fuzz", Quantum: 100 * time.Millisecond, Grace: 50 * time.Millisecond, Budget: budget,
		ProductionPriority: threshold(100)}
	fromPod := (in[0]/4)%2 == 1
	// classOf is the class source of a client joining with arg.
	classOf := func(arg uint64) classSource {
		return classSource{asked: Class(arg % 2), fromPod: fromPod, value: int32(arg%3) * 100, known: arg%7 != 6}
	}
	switch in[0] % 4 {
	case 0, 1, 2:
		cfg.Mode = Mode(in[0] % 4) // Auto, Always, Off
	case 3:
		cfg.Budget = 0 // the lock only
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	q := newQueue(cfg, clock, m, logr.Discard())
	q.evictTimeout = time.Second
	fx := &queueFixture{q: q, clock: clock, m: m}
	var cs [4]*fakeClient
	for i := range cs {
		switch i {
		case 2:
			fx.version = 3 // one client without PACE
		case 3:
			fx.version = MinVersion // one client without the overlapped hand-off
		}
		cs[i] = fx.joinAs(t, classOf(uint64(i)))
		fx.version = 0
	}
	prev := observeQueue(q, cs[:])
	in = in[1:]
	for step := 0; len(in) >= 3; step, in = step+1, in[3:] {
		op, slot, arg := in[0]%11, int(in[1])%len(cs), uint64(in[2])
		f := cs[slot]
		q.mu.Lock()
		_, joined := q.clients[f.c.id]
		epoch, res, target, raises := f.c.epoch, f.c.reservation, f.c.evictTarget, f.c.raises
		q.mu.Unlock()
		switch op {
		case 0, 1:
			q.acquire(f.c, arg*mib)
		case 2:
			q.release(f.c, epoch, min(arg*mib, res))
		case 3:
			q.memReq(f.c, arg*mib)
		case 4: // a periodic report, acks up to date or stale
			if arg >= 128 { // a smaller need than it has resident
				need := (arg - 128) * mib
				q.usage(f.c, Message{Type: MsgUsage, Reason: UsageReport, Acks: raises, Need: need, Resident: min(res, 2*need)})
				break
			}
			q.usage(f.c, Message{Type: MsgUsage, Reason: UsageReport, Acks: raises - uint32(arg%2), Need: arg * mib, Resident: min(arg*mib, res)})
		case 5: // an eviction answered (done or failed), or its progress
			resident, reason := target, UsageEvicted
			switch arg % 4 {
			case 0:
				resident = res
			case 1:
				reason = UsageProgress
				if res > target {
					resident = target + (res-target)/2
				}
			}
			q.usage(f.c, Message{Type: MsgUsage, Reason: reason, Acks: raises, Need: res, Resident: resident})
		case 6:
			q.leave(f.c)
		case 7:
			if !joined {
				f = fx.joinAs(t, classOf(arg))
				cs[slot] = f
			}
			if arg >= 128 {
				q.rejoin(f.c, Message{Type: MsgRejoin, Need: (arg - 128) * mib, Resident: (arg - 128) * mib})
			}
		case 8, 9:
			if op == 9 && arg >= 240 {
				if cfg.Budget > 0 {
					cfg.Budget = (arg - 239) * 8 * mib
					q.reconfigure(cfg)
				}
				break
			}
			clock.Advance(time.Duration(arg) * 10 * time.Millisecond)
		case 10:
			cfg.ProductionPriority = []*int32{nil, threshold(0), threshold(100), threshold(200), threshold(300)}[arg%5]
			cfg.OpportunisticQueue = uint32(arg % 3)
			q.reconfigure(cfg)
		}
		// A client the queue dropped (it stopped reading, ignored an eviction, asked for too much)
		// loses its connection, and the connection's end makes it leave, as serveConn does.
		for _, c := range cs {
			if c.dropped {
				q.leave(c.c)
			}
		}
		cur := observeQueue(q, cs[:])
		if err := checkQueueInvariants(q, cs[:]); err != nil {
			return fmt.Errorf("step %d (op %d): %w", step, op, err)
		}
		if err := checkPaceMessages(q, cs[:]); err != nil {
			return fmt.Errorf("step %d (op %d): %w", step, op, err)
		}
		if err := checkQueueStep(prev, cur, (op == 7 || op == 9) && arg >= 128); err != nil {
			return fmt.Errorf("step %d (op %d): %w", step, op, err)
		}
		prev = cur
	}
	return nil
}

// checkPaceMessages checks the PACE each client received: only a version 4 client gets any, no value
// repeats the one before it (a first 0 repeats the unbounded start), and the last one is the bound the
// queue believes the client runs under.
func checkPaceMessages(q *queue, cs []*fakeClient) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, f := range cs {
		var last uint32
		for _, m := range f.got {
			if m.Type != MsgPace {
				continue
			}
			if !f.c.paces() {
				return fmt.Errorf("client %d of version %d was sent PACE", f.c.id, f.c.version)
			}
			if m.MaxQueued == last {
				return fmt.Errorf("client %d was sent PACE %d again", f.c.id, last)
			}
			last = m.MaxQueued
		}
		if _, connected := q.clients[f.c.id]; connected && last != f.c.pace {
			return fmt.Errorf("client %d was last sent PACE %d, the queue has it at %d", f.c.id, last, f.c.pace)
		}
	}
	return nil
}

// queueObservation is what checkQueueStep compares between two steps.
type queueObservation struct {
	budget, reserved uint64
	states           map[*client]clientState
}

func observeQueue(q *queue, cs []*fakeClient) queueObservation {
	q.mu.Lock()
	defer q.mu.Unlock()
	o := queueObservation{budget: q.budget, reserved: q.reserved, states: map[*client]clientState{}}
	for _, c := range q.clients {
		o.states[c] = c.state
	}
	for _, f := range cs {
		o.states[f.c] = f.c.state
	}
	return o
}

// reachable[a][b]: a client in state a may be in state b after one call into the queue, which may
// move it more than once (granted part of its need, filled and started in one dispatch).
var reachable = func() (r [numClientStates][numClientStates]bool) {
	for s := range numClientStates {
		r[s][s] = true
	}
	for range numClientStates {
		for _, tr := range clientTransitions {
			for s := range numClientStates {
				if r[s][tr.from] {
					r[s][tr.to] = true
				}
			}
		}
	}
	return r
}()

// checkQueueStep checks one step's changes: every client moved only along clientTransitions, and
// the reserved sum, when above the budget, did not grow but by a re-announcement (rejoin: the step
// may have re-announced or changed the budget).
func checkQueueStep(prev, cur queueObservation, rejoin bool) error {
	for c, to := range cur.states {
		from, ok := prev.states[c]
		if !ok {
			from = stateIdle // joined in this step
		}
		if !reachable[from][to] {
			return fmt.Errorf("client %d moved %v -> %v, not along clientTransitions", c.id, from, to)
		}
	}
	if !rejoin && cur.budget > 0 && cur.reserved > max(cur.budget, prev.reserved) {
		return fmt.Errorf("reserved %d rose from %d above the budget %d", cur.reserved, prev.reserved, cur.budget)
	}
	return nil
}

// checkQueueInvariants checks the queue and every client, cs as well as those that left.
func checkQueueInvariants(q *queue, cs []*fakeClient) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.violations) > 0 {
		return fmt.Errorf("%d broken invariants, the first: %w", len(q.violations), q.violations[0])
	}
	var sum uint64
	nGranted, nWaiting := 0, 0
	for _, c := range q.clients {
		sum += c.reservation
		if q.budget == 0 && c.reservation != 0 {
			return fmt.Errorf("client %d reserves %d on a GPU without a budget", c.id, c.reservation)
		}
		if c.state.granted() {
			nGranted++
		}
		if c.state == stateWaiting {
			nWaiting++
		}
	}
	for _, f := range cs {
		if err := q.clientInvariantLocked(f.c); err != nil {
			return err
		}
	}
	for _, c := range q.clients {
		if err := q.clientInvariantLocked(c); err != nil {
			return err
		}
	}
	if sum != q.reserved {
		return fmt.Errorf("reserved %d != sum of reservations %d", q.reserved, sum)
	}
	if q.exclusive() && len(q.holders) > 1 {
		return fmt.Errorf("%d holders of an exclusive GPU", len(q.holders))
	}
	if nGranted != len(q.holders) {
		return fmt.Errorf("%d clients granted, %d in the holder list", nGranted, len(q.holders))
	}
	for _, h := range q.holders {
		if !h.state.granted() || q.clients[h.id] != h {
			return fmt.Errorf("holder %d: %v, connected=%v", h.id, h.state, q.clients[h.id] == h)
		}
	}
	if nWaiting != q.nWaitingLocked() {
		return fmt.Errorf("%d clients waiting, %d in the waiting lists", nWaiting, q.nWaitingLocked())
	}
	for p := range q.waiting {
		for _, w := range q.waiting[p] {
			if w.state != stateWaiting || w.class != Class(p) || q.clients[w.id] != w {
				return fmt.Errorf("waiter %d: %v, priority %v, connected=%v", w.id, w.state, w.class, q.clients[w.id] == w)
			}
		}
	}
	return nil
}
