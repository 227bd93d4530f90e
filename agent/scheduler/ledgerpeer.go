package scheduler

import "sync"

// The ledger of a process whose claim lookup fails.
//
// A claim lookup (Options.ClaimOf) names a process's claim ledger; the agent finds it without the API
// server (the pod UIDs its kubelet plugin recorded for each claim, against the UID in the process's
// cgroup), and through the API server only where a claim on the GPU was recorded without them (a
// checkpoint written before they were kept, until the plugin reads the claims). Such a lookup may fail;
// the process then starts outside any ledger, with its own per-process limit, and is placed once a later
// lookup finds its claim (reresolve). A process's pod is known at once, without the API server: its peer
// (Options.PeerKey, the pod's UID from the process's cgroup). So the processes of one pod on a GPU are
// one peer for the ledger:
//
//   - a process whose lookup fails joins the claim another process of its pod resolved on the GPU,
//     as any process of that claim would (admitted while the ledger has room for its context);
//   - when a later lookup places one process of a pod, every process of that pod still outside on
//     the GPU is placed in the same ledger at once (its context exists: accounted, as a re-announced
//     grant is), without waiting for its own lookup's back-off;
//   - a process of a pod outside any ledger is looked up again, with back-off, for as long as it
//     stays connected, whether or not its class is known.
//
// There is no ledger for a pod whose claim no lookup has found: its size would have to come from the
// pod itself (the limit its processes' environment names, which a process chooses when it starts), and
// the agent's own record of the pod's claims is what the lookup reads already. A process outside keeps
// its per-process limit, and the claim guard judges its pod by NVML's figures meanwhile.

// peerLedgers are the ledger state of each peer (a pod) on each GPU.
type peerLedgers struct {
	mu sync.Mutex
	m  map[podSlot]*peerEntry
	// of is each counted client's pod, named once at its connection (a process that is gone names none).
	of map[*member]podSlot
}

type podSlot struct {
	q    *queue
	peer string
}

type peerEntry struct {
	claim   Claim // a claim a process of the peer resolved on the GPU; Key "": none yet
	members map[*member]struct{}
}

// podPeer is the pod of the process pid ("": none known, or the scheduler names no pods).
func (s *Scheduler) podPeer(pid int32) string {
	if s.opts.PeerKey == nil || pid == 0 {
		return ""
	}
	return s.opts.PeerKey(pid)
}

// claimOf is the claim ledger of the process pid of pod peer ("": none known) on q: Options.ClaimOf's,
// else the claim a process of its pod resolved on q. A resolved claim is remembered for the pod.
func (s *Scheduler) claimOf(q *queue, pid int32, peer string) (Claim, bool) {
	if s.opts.ClaimOf == nil || pid == 0 {
		return Claim{}, false
	}
	cl, ok := s.opts.ClaimOf(q.uuid, pid)
	if peer == "" {
		return cl, ok
	}
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	e := s.peers.entryLocked(q, peer)
	switch {
	case ok:
		e.claim = cl
	case e.claim.Key != "":
		cl, ok = e.claim, true
	}
	return cl, ok
}

func (p *peerLedgers) entryLocked(q *queue, peer string) *peerEntry {
	if p.m == nil {
		p.m = map[podSlot]*peerEntry{}
	}
	k := podSlot{q, peer}
	e := p.m[k]
	if e == nil {
		e = &peerEntry{members: map[*member]struct{}{}}
		p.m[k] = e
	}
	return e
}

// peerJoined counts m, a client on q of pod peer ("": none known), among its pod's.
func (s *Scheduler) peerJoined(q *queue, peer string, m *member) {
	if peer == "" {
		return
	}
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	s.peers.entryLocked(q, peer).members[m] = struct{}{}
	if s.peers.of == nil {
		s.peers.of = map[*member]podSlot{}
	}
	s.peers.of[m] = podSlot{q, peer}
}

// peerLeft forgets m; a pod with no client left on its GPU is forgotten.
func (s *Scheduler) peerLeft(m *member) {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	k, ok := s.peers.of[m]
	if !ok {
		return
	}
	delete(s.peers.of, m)
	if e := s.peers.m[k]; e != nil {
		delete(e.members, m)
		if len(e.members) == 0 {
			delete(s.peers.m, k)
		}
	}
}

// peerOf is m's pod ("": none).
func (s *Scheduler) peerOf(m *member) string {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	return s.peers.of[m].peer
}

// attachPeers places every client of m's pod on q that is still outside its claim's ledger in cl's, now
// that a lookup found it for m.
func (s *Scheduler) attachPeers(q *queue, m *member, cl Claim) {
	s.peers.mu.Lock()
	k, ok := s.peers.of[m]
	s.peers.mu.Unlock()
	if ok {
		s.attachPod(q, k.peer, cl)
	}
}

// attachPod places every client of pod peer on q that is still outside any ledger in cl's, the claim a
// lookup found for one of its processes, before that process joins: a pod's processes are never in two
// ledgers at once.
func (s *Scheduler) attachPod(q *queue, peer string, cl Claim) {
	s.peers.mu.Lock()
	var ms []*member
	if e := s.peers.m[podSlot{q, peer}]; e != nil {
		e.claim = cl
		for o := range e.members {
			ms = append(ms, o)
		}
	}
	s.peers.mu.Unlock()
	b := s.book(q)
	for _, m := range ms {
		if b.attach(m, cl) {
			q.log.Info("Shim client placed in its claim's ledger with another process of its pod", "pod", peer, "claim", cl.Key)
		}
	}
}

// claimPending: the client m on q, a process of a pod, is outside any ledger where the scheduler has
// ledgers: its claim is to be looked up again.
func (s *Scheduler) claimPending(q *queue, m *member) bool {
	return s.opts.ClaimOf != nil && s.peerOf(m) != "" && !s.book(q).placed(m)
}

// placed: m is in a claim's ledger, or was refused by one.
func (b *ledgerBook) placed(m *member) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return m.l != nil || m.refused != nil
}

// peerClaimKey is the ledger the processes of pod peer on q are in: the claim one of them resolved ("":
// none yet).
func (s *Scheduler) peerClaimKey(q *queue, peer string) string {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	if e := s.peers.m[podSlot{q, peer}]; e != nil {
		return e.claim.Key
	}
	return ""
}
