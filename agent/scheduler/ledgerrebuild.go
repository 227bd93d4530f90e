package scheduler

import "sync"

// The ledgers through a rebuild window (rebuild.go).
//
// A restarted scheduler's ledgers start empty, and its earlier clients come back one by one: each
// reconnects within the window and then announces what it holds (RETURN flags HOLD). A process that
// connects meanwhile, or a Charge, decided against the ledger as it stands would count none of the
// memory of those not yet back (or back, but whose Hold is still on its way), and so could take the
// claim past its size: a process holding 95 MiB of a 128 MiB claim, a restart, and a second process
// admitted before the first is back leaves the two holding 143 MiB.
//
// So while the window lasts, every decision of a ledger (an admission, a Charge) counts, beside what
// the ledger charges, what NVML shows the claim's processes holding beyond it: for a process in the
// ledger, its NVML figure less its context charge and grant; for one NVML lists on the GPU and no ledger
// holds yet, its whole figure, where its claim lookup names the same ledger (looked up once per window).
// The decision is made at once, never deferred: no client waits past the window for it. After the
// window every earlier client is back and has announced itself (or has gone), and the ledger alone
// decides again.

// windowClaims remembers, for one rebuild window, the claim each process NVML lists was looked up in.
type windowClaims struct {
	mu sync.Mutex
	of map[int32]Claim // Key "": in none
}

// unannounced is what NVML shows the processes of claim key on q holding beyond what q's ledger charges
// them, but pid's (the process being decided on): zero outside the rebuild window, without NVML, or
// where NVML cannot be read.
func (s *Scheduler) unannounced(q *queue, key string, pid int32) uint64 {
	if s.opts.ProcessMemory == nil || key == "" || !q.rebuilding() {
		return 0
	}
	used, err := s.opts.ProcessMemory(q.uuid)
	if err != nil {
		return 0 // could not check: the ledger alone, as without NVML
	}
	b := s.book(q)
	charged, elsewhere := b.chargesOf(key)
	var others []int32
	for p := range used {
		if _, in := charged[p]; !in && p != pid && p > 0 && !elsewhere[p] {
			others = append(others, p)
		}
	}
	s.lookUpForWindow(q, b, others)
	var sum uint64
	for p, v := range used {
		if p == pid || p <= 0 || v == ^uint64(0) {
			continue
		}
		c, in := charged[p]
		if !in && (elsewhere[p] || s.windowKeyOf(q, b, p) != key) {
			continue
		}
		if v > c {
			sum += v - c
		}
	}
	return sum
}

// lookUpForWindow looks up the claims of pids not looked up yet this window, all at once: each lookup
// may take its deadline (the API server slow), and they run before a client's WELCOME.
func (s *Scheduler) lookUpForWindow(q *queue, b *ledgerBook, pids []int32) {
	var wg sync.WaitGroup
	for _, p := range pids {
		b.window.mu.Lock()
		_, known := b.window.of[p]
		b.window.mu.Unlock()
		if !known {
			wg.Go(func() { s.windowClaimOf(q, b, p) })
		}
	}
	wg.Wait()
}

// chargesOf is, per pid in ledger key, its context charge and grant together; and the pids in q's other
// ledgers (or refused by one).
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

// windowClaimOf is the claim of the process pid on q, looked up once per window.
func (s *Scheduler) windowClaimOf(q *queue, b *ledgerBook, pid int32) Claim {
	w := &b.window
	w.mu.Lock()
	cl, ok := w.of[pid]
	w.mu.Unlock()
	if ok {
		return cl
	}
	if s.opts.ClaimOf != nil {
		if c, found := s.opts.ClaimOf(q.uuid, pid); found {
			cl = c
		}
	}
	w.mu.Lock()
	if w.of == nil {
		w.of = map[int32]Claim{}
	}
	w.of[pid] = cl
	w.mu.Unlock()
	return cl
}

// windowKeyOf is the ledger the process pid would join on q: its claim's, else its pod's provisional one.
func (s *Scheduler) windowKeyOf(q *queue, b *ledgerBook, pid int32) string {
	if cl := s.windowClaimOf(q, b, pid); cl.Key != "" {
		return cl.Key
	}
	if peer := s.podPeer(pid); peer != "" {
		return provisionalKey(peer)
	}
	return ""
}

// rebuilding: q's rebuild window lasts.
func (q *queue) rebuilding() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.rebuild.until.After(q.clock.Now())
}
