package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// FuzzQueue drives one GPU's queue with any sequence of client actions (join, acquire, release, grow,
// report, answer or ignore an eviction, leave, time passing) and checks its invariants after each:
// the reserved sum equals the sum of the reservations, it never exceeds the budget, an exclusive GPU
// has at most one holder, and holders and waiters are consistent. The seeds run in every `go test`.
func FuzzQueue(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 40, 1, 1, 40, 8, 0, 200, 2, 0, 0})
	f.Add([]byte{1, 0, 0, 1, 0, 60, 1, 1, 30, 5, 0, 0, 8, 0, 250, 8, 0, 250, 1, 2, 10})
	f.Add([]byte{2, 0, 0, 1, 0, 20, 1, 1, 20, 1, 2, 20, 3, 0, 50, 3, 1, 60, 6, 0, 0})
	f.Add([]byte{3, 0, 0, 1, 0, 0, 1, 1, 0, 8, 0, 255, 8, 0, 255, 2, 1, 0})
	// an overlapped hand-off: a releases, b is granted while a's eviction reports progress
	f.Add([]byte{1, 0, 0, 40, 4, 0, 40, 0, 1, 40, 2, 0, 40, 5, 0, 1, 5, 0, 1, 5, 0, 2, 4, 1, 40})
	// the same with the newcomer a version 2 client (cs[3])
	f.Add([]byte{1, 0, 0, 40, 4, 0, 40, 0, 3, 40, 2, 0, 40, 5, 0, 1, 5, 0, 2, 4, 3, 40})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		const budget = 64 * mib
		cfg := GPUConfig{UUID: "GPU-fuzz", Quantum: 100 * time.Millisecond, Grace: 50 * time.Millisecond, Budget: budget}
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
			if i == len(cs)-1 {
				fx.version = MinVersion // one client without the overlapped hand-off
			}
			cs[i] = fx.join(t, Priority(i%2))
		}
		fx.version = 0
		in = in[1:]
		for step := 0; len(in) >= 3; step, in = step+1, in[3:] {
			op, f, arg := in[0]%10, cs[int(in[1])%len(cs)], uint64(in[2])
			q.mu.Lock()
			_, joined := q.clients[f.c.id]
			epoch, res, target, raises := f.c.epoch, f.c.reservation, f.c.evictTarget, f.c.raises
			q.mu.Unlock()
			if !joined && op != 7 {
				continue
			}
			switch op {
			case 0, 1:
				q.acquire(f.c, arg*mib)
			case 2:
				q.release(f.c, epoch, min(arg*mib, res))
			case 3:
				q.memReq(f.c, arg*mib)
			case 4: // a periodic report, acks up to date or stale
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
					cs[int(in[1])%len(cs)] = fx.join(t, Priority(arg%2))
				}
			case 8, 9:
				clock.Advance(time.Duration(arg) * 10 * time.Millisecond)
			}
			// A client the queue dropped (it stopped reading, ignored an eviction, asked for too much)
			// loses its connection, and the connection's end makes it leave, as serveConn does.
			for _, c := range cs {
				if c.dropped {
					q.leave(c.c)
				}
			}
			if err := checkQueueInvariants(q); err != nil {
				t.Fatalf("step %d (op %d): %v", step, op, err)
			}
		}
	})
}

func checkQueueInvariants(q *queue) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var sum uint64
	for _, c := range q.clients {
		sum += c.reservation
		if q.budget == 0 && c.reservation != 0 {
			return fmt.Errorf("client %d reserves %d on a GPU without a budget", c.id, c.reservation)
		}
		if c.holding && c.waiting {
			return fmt.Errorf("client %d both holds and waits", c.id)
		}
		if c.filling && (!c.holding || c.reservation >= c.need || !c.fillsPartially()) {
			return fmt.Errorf("client %d (version %d) filling: holding=%v, reservation %d, need %d", c.id, c.version,
				c.holding, c.reservation, c.need)
		}
	}
	if sum != q.reserved {
		return fmt.Errorf("reserved %d != sum of reservations %d", q.reserved, sum)
	}
	if q.budget > 0 && q.reserved > q.budget {
		return fmt.Errorf("reserved %d > budget %d", q.reserved, q.budget)
	}
	if q.exclusive() && len(q.holders) > 1 {
		return fmt.Errorf("%d holders of an exclusive GPU", len(q.holders))
	}
	for _, h := range q.holders {
		if !h.holding || q.clients[h.id] != h {
			return fmt.Errorf("holder %d: holding=%v, connected=%v", h.id, h.holding, q.clients[h.id] == h)
		}
	}
	nWaiting := 0
	for _, c := range q.clients {
		if c.waiting {
			nWaiting++
		}
	}
	if nWaiting != q.nWaitingLocked() {
		return fmt.Errorf("%d clients waiting, %d in the waiting lists", nWaiting, q.nWaitingLocked())
	}
	for p := range q.waiting {
		for _, w := range q.waiting[p] {
			if !w.waiting || q.clients[w.id] != w {
				return fmt.Errorf("waiter %d: waiting=%v, connected=%v", w.id, w.waiting, q.clients[w.id] == w)
			}
		}
	}
	return nil
}
