package scheduler

import "sync"

// The ledgers after a restart (rebuild.go).
//
// A restarted scheduler's ledgers start empty, and its earlier clients come back one by one: each
// reconnects (within the rebuild window, unless it is stopped or slow) and then announces what it holds
// (RETURN flags HOLD). A process that connects meanwhile, or a Charge, decided against the ledger as it
// stands would count none of the memory of those not back yet (or back, but whose Hold is still on its
// way), and so could take the claim past its size: a process holding 95 MiB of a 128 MiB claim, a
// restart, and a second process admitted before the first is back leaves the two holding 143 MiB.
//
// So the scheduler notes the processes NVML lists on each GPU when it starts on a socket a previous run
// left (the earlier processes), and every decision of a ledger (an admission, a Charge) counts, beside
// what the ledger charges, what NVML shows the claim's processes holding beyond it:
//   - an earlier process no ledger holds yet, its whole figure, where its claim lookup names the same
//     ledger (looked up once; where that lookup failed, the ledger its pod's processes are in now,
//     ledgerpeer.go), until it joins a ledger or NVML no longer lists it;
//   - while the rebuild window lasts, a process in the ledger, its NVML figure less its context charge
//     and grant (its Hold may be on its way).
//
// The decision is made at once, never deferred: no client waits for another to come back. An earlier
// process that never comes back (it dropped the shim; the agent names it unmanaged) stays counted
// against its claim for as long as it holds memory, as the claim guard counts it.

// earlierProcs are the processes NVML listed on a GPU at a restart, with the claim each was looked up
// in (Key "": in none); one leaves when it joins a ledger or NVML no longer lists it.
type earlierProcs struct {
	mu   sync.Mutex
	pids map[int32]bool // looked up already
	of   map[int32]Claim
	peer map[int32]string
}

// noteEarlier records the processes NVML lists on q now, as the scheduler starts after a previous run.
func (s *Scheduler) noteEarlier(q *queue) {
	if s.opts.ProcessMemory == nil {
		return
	}
	used, err := s.opts.ProcessMemory(q.uuid)
	if err != nil {
		return // could not check: the ledger alone, as without NVML
	}
	e := &s.book(q).earlier
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pids, e.of, e.peer = map[int32]bool{}, map[int32]Claim{}, map[int32]string{}
	for p, v := range used {
		if p > 0 && v > 0 {
			e.pids[p] = false
		}
	}
}

// unannounced is what NVML shows the processes of claim key on q holding beyond what q's ledger charges
// them, but pid's (the process being decided on): zero without NVML, where NVML cannot be read, and
// once the window is over and every earlier process is back or gone.
func (s *Scheduler) unannounced(q *queue, key string, pid int32) uint64 {
	b := s.book(q)
	window := q.rebuilding()
	if s.opts.ProcessMemory == nil || key == "" || (!window && !b.earlier.any()) {
		return 0
	}
	used, err := s.opts.ProcessMemory(q.uuid)
	if err != nil {
		return 0
	}
	charged, elsewhere := b.chargesOf(key)
	pending := b.earlier.pending(used, charged, elsewhere)
	s.lookUpEarlier(q, b, pending)
	var sum uint64
	for p, v := range used {
		if p == pid || p <= 0 || v == ^uint64(0) {
			continue
		}
		if c, in := charged[p]; in {
			if window && v > c {
				sum += v - c
			}
			continue
		}
		if k, peer, ok := b.earlier.keyOf(p); ok && (k == key || k == "" && peer != "" && s.peerClaimKey(q, peer) == key) {
			sum += v
		}
	}
	return sum
}

// any: an earlier process is not back yet.
func (e *earlierProcs) any() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.pids) > 0
}

// pending forgets the earlier processes that are back (in a ledger) or gone (NVML lists them no more)
// and returns those not looked up yet.
func (e *earlierProcs) pending(used map[int32]uint64, charged map[int32]uint64, elsewhere map[int32]bool) []int32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []int32
	for p, looked := range e.pids {
		_, in := charged[p]
		if v, listed := used[p]; in || elsewhere[p] || !listed || v == 0 {
			delete(e.pids, p)
			delete(e.of, p)
			continue
		}
		if !looked {
			out = append(out, p)
		}
	}
	return out
}

// keyOf is the ledger the earlier process p would join ("": its claim lookup failed) and its pod
// ("": none known); ok false: p is no earlier process left.
func (e *earlierProcs) keyOf(p int32) (string, string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.pids[p]; !ok {
		return "", "", false
	}
	return e.of[p].Key, e.peer[p], true
}

// lookUpEarlier looks up the ledgers of pids all at once: each lookup may take its deadline (the API
// server slow), and they run before a client's WELCOME. A pid whose claim lookup fails counts in the
// ledger its pod's processes are in (ledgerpeer.go), if any.
func (s *Scheduler) lookUpEarlier(q *queue, b *ledgerBook, pids []int32) {
	var wg sync.WaitGroup
	for _, p := range pids {
		wg.Go(func() {
			var cl Claim
			if s.opts.ClaimOf != nil {
				if c, ok := s.opts.ClaimOf(q.uuid, p); ok {
					cl = c
				}
			}
			peer := s.podPeer(p)
			e := &b.earlier
			e.mu.Lock()
			if _, ok := e.pids[p]; ok {
				e.pids[p], e.of[p], e.peer[p] = true, cl, peer
			}
			e.mu.Unlock()
		})
	}
	wg.Wait()
}

// chargesOf is, per pid in ledger key, its context charge and grant together; and the pids in q's other
// ledgers.
func (b *ledgerBook) chargesOf(key string) (map[int32]uint64, map[int32]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	charged, elsewhere := map[int32]uint64{}, map[int32]bool{}
	for k, l := range b.byKey {
		for m := range l.members {
			if m.pid <= 0 {
				continue
			}
			if k == key {
				charged[m.pid] += m.ctx + m.grant
			} else {
				elsewhere[m.pid] = true
			}
		}
	}
	return charged, elsewhere
}

// rebuilding: q's rebuild window lasts.
func (q *queue) rebuilding() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.rebuild.until.After(q.clock.Now())
}
