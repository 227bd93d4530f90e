package scheduler

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// One memory ledger per claim (protocol version 6, shim/include/gpushare_proto.h).
//
// A claim of M bytes is the device memory its pods' processes hold as NVML counts it, CUDA contexts
// included, because that is what the claim guard judges. Each process is charged for its context: the
// context reserve R (Guards.ContextReserve) until NVML has a figure for it, then what NVML counts beyond
// its grant (never below Guards.ContextFloor; context.go). The allocations of a ledger's processes
// together may reach M less their context charges. The pods that share a claim are one ledger
// (Claim.Key), so a pod of N processes, or the two pods of a shared claim, hold at most the claim
// together, where a per-process limit let each process take all of it.
//
// A process allocates within its grant without asking (the shim's atomic counter); beyond it, it asks
// for more with CHARGE and the scheduler adds at least a chunk (Guards.LedgerChunk) while the ledger has
// room, so an allocator that makes thousands of calls asks once per chunk. The shim returns what it
// holds unused beyond a couple of chunks, so one process's slack does not starve the others. A grant
// returns to the ledger when its connection ends, which is when the process is gone (or has lost its
// scheduler, and then announces its grant again on the next connection, RETURN flags HOLD).
//
// A process is admitted before its CUDA context exists: the shim connects when the process first
// creates or retains a context, and the scheduler places it in its ledger only while the ledger has room
// for one more context (grants + contexts + R <= M). Refused, the process holds nothing, is not counted
// in n, and its context creation fails with out of memory (LEDGER flags REFUSED). n counts admitted
// processes; a disconnect returns the process's grant and its context charge.
//
// The ledger's bound, grants + contexts <= M, holds for everything the scheduler decides. Only what
// exists before the scheduler could decide may take a ledger beyond it, and is accounted rather than
// refused: a context NVML shows larger than it was charged, a re-announced grant (RETURN flags HOLD,
// after a scheduler restart: the context and the memory are there, admitted or not), a protocol 5 or
// older client (it cannot be told no), and a client whose pod is found only after it connected
// (ledgerAttach). The ledger then refuses every CHARGE until frees or
// leaves bring it back within, and the guard judges the pod meanwhile; ledgerBook.checkLocked records
// anything else as a broken invariant.

// Defaults of the ledger's Guards.
const (
	// DefaultContextReserve is R, the device memory charged per process for its CUDA context: above the
	// contexts measured on the GPU (docs/dra.md, "What a claim guarantees"), with a margin for the driver's
	// per-process growth (more streams, modules loaded, workspaces outside the caching allocator).
	DefaultContextReserve = 768 << 20
	// DefaultContextFloor is the least a process is charged for its context once NVML has a figure for
	// it: below a bare CUDA context (518 MiB on the H200, docs/dra.md), so a small measurement stands.
	DefaultContextFloor = 256 << 20
	// DefaultLedgerChunk is the least a CHARGE adds to a grant while the ledger has room.
	DefaultLedgerChunk = 64 << 20
)

// Claim names the ledger of a client.
type Claim struct {
	// Key is the ledger: clients of one GPU with the same Key share one ledger (the pods of a claim).
	Key string
	// Memory is M, the claim's bytes on the GPU.
	Memory uint64
}

// ChargeStatus answers a Charge.
type ChargeStatus uint32

const (
	ChargeOK      ChargeStatus = 0 // Added bytes were added to the grant
	ChargeRefused ChargeStatus = 1 // the ledger has not that much room
)

// Flags of Ledger and Return messages.
const (
	LedgerOn      uint32 = 1 // Ledger: the client's allocations are charged to a claim's ledger
	LedgerRefused uint32 = 2 // Ledger: the client's claim has no room for its context: it may not create one
	ReturnHold    uint32 = 1 // Return: on a new connection, the grant the client holds
)

// LedgerState is one ledger as the metrics and tests see it.
type LedgerState struct {
	GPU       string
	Key       string
	Claim     uint64 // M
	Processes int    // n
	Contexts  uint64 // the processes' context charges together
	Total     uint64 // M less Contexts, 0 when negative
	Granted   uint64
	Refusals  uint64
}

// ledgerBook is one GPU's ledgers.
type ledgerBook struct {
	gpu            string
	reserve, chunk uint64
	floor          uint64 // the least context charge once measured (Guards.ContextFloor)
	watching       bool   // its ledgers are measured periodically (context.go)
	measuring      sync.Mutex
	earlier        earlierProcs // the processes NVML listed at a restart, not back yet (ledgerrebuild.go)

	mu     sync.Mutex
	byKey  map[string]*ledger
	broken []error // broken invariants (checkLocked); tests fail on any
}

type ledger struct {
	key      string
	claim    uint64
	members  map[*member]struct{}
	granted  uint64
	contexts uint64 // the members' context charges together
	refusals uint64
	// over: a forced admission or a re-announced grant left the grants beyond the total (allowed; no
	// raise and no admission is).
	over bool
}

// member is one client in a ledger (l nil: a version 6 client without one, told so once; refused
// non-nil: the claim that had no room for its context).
type member struct {
	l        *ledger
	refused  *Claim
	version  uint16
	pid      int32 // the kernel's pid, whose NVML figure measures its context (0: none)
	grant    uint64
	ctx      uint64 // its context charge: R until measured, then context.go's figure
	peak     uint64 // its largest grant since the measurement under way began (context.go)
	measured bool
	send     func([]byte) bool
	drop     func()
	welcomed bool // its Welcome is queued: Ledger messages may follow
	charged  bool // sent a Charge or a Hold: a Hold is no longer accepted
	gone     bool // its connection ended: it joins nothing any more
}

func (m *member) speaks() bool { return m.version == 0 || m.version >= 6 }

// total is what the members' allocations may reach together: the claim less their context charges.
func (l *ledger) total() uint64 {
	if l.contexts > l.claim {
		return 0
	}
	return l.claim - l.contexts
}

// book returns q's ledgers.
func (s *Scheduler) book(q *queue) *ledgerBook {
	if b, ok := s.books.Load(q); ok {
		return b.(*ledgerBook)
	}
	b, _ := s.books.LoadOrStore(q, &ledgerBook{gpu: q.uuid, reserve: s.opts.ContextReserve, chunk: s.opts.LedgerChunk,
		floor: s.opts.ContextFloor, byKey: map[string]*ledger{}})
	return b.(*ledgerBook)
}

// ledgerJoin enters the client pid into its claim's ledger, where Guards.ClaimOf names one, and returns
// the send the queue must use: it queues the client's first Ledger right behind its Welcome, before
// anything else the queue sends (Policy, Pace, Idle), because the shim reads it with the Welcome. The
// lookup runs between the client's HELLO and its WELCOME, outside every lock. pid is the kernel's (0 where
// it gives none): the pid a hello reports never chooses a pod's ledger, as it never chooses its class.
func (s *Scheduler) ledgerJoin(q *queue, pid int32, version uint16, send func([]byte) bool, drop func()) (*member, func([]byte) bool) {
	peer := s.podPeer(pid) // ledgerpeer.go
	cl, ok := s.claimOf(q, pid, peer)
	if ok && peer != "" {
		s.attachPod(q, peer, cl) // its pod's processes outside any ledger join the claim's first
	}
	b := s.book(q)
	m := b.join(cl, ok, pid, version, send, drop, s.unannounced(q, cl.Key, pid))
	s.watchContexts(q, b)
	s.peerJoined(q, peer, m)
	var welcomed atomic.Bool
	return m, func(f []byte) bool {
		if welcomed.Swap(true) {
			return send(f)
		}
		return send(f) && b.welcome(m)
	}
}

// join enters a new client in cl's ledger (ok: it has one); unseen is what the claim's processes hold
// beyond what the ledger charges them (ledgerrebuild.go), which an admission leaves room for.
func (b *ledgerBook) join(cl Claim, ok bool, pid int32, version uint16, send func([]byte) bool, drop func(), unseen uint64) *member {
	m := &member{version: version, pid: pid, send: send, drop: drop, ctx: b.reserve}
	if !ok || cl.Memory == 0 {
		return m
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.admitLocked(m, cl, !m.speaks(), unseen) // an older client cannot be told no: its context is counted
	return m
}

// admitLocked places m in cl's ledger when the ledger has room for one more context beside unseen
// bytes, or forced (its context exists already); otherwise m stays out, holding nothing, and remembers
// cl for its Ledger.
func (b *ledgerBook) admitLocked(m *member, cl Claim, forced bool, unseen uint64) bool {
	l := b.byKey[cl.Key]
	if !forced && !b.roomForOneMore(l, cl.Memory, unseen) {
		m.refused = &cl
		if l != nil {
			l.refusals++
		}
		return false
	}
	if l == nil {
		l = &ledger{key: cl.Key, members: map[*member]struct{}{}}
		b.byKey[cl.Key] = l
	}
	l.claim = cl.Memory // the claim as the agent knows it now
	l.members[m] = struct{}{}
	l.contexts += m.ctx
	m.l, m.refused = l, nil
	b.settleLocked(l, forced)
	b.pushLocked(l, m)
	return true
}

// roomForOneMore says whether l (nil: none yet) can take one more process of a claim of claim bytes:
// its grants, context charges and unseen bytes plus one more context reserve within the claim.
func (b *ledgerBook) roomForOneMore(l *ledger, claim, unseen uint64) bool {
	var granted, contexts uint64
	if l != nil {
		granted, contexts = l.granted, l.contexts
	}
	need := contexts + b.reserve
	return need <= claim && granted <= claim-need && unseen <= claim-need-granted
}

// attach places m, connected outside every ledger because its claim lookup failed, in cl's ledger now
// that a lookup found it. Its context exists already (it may have allocated under its own limit), so it
// is admitted whatever the room, as a re-announced grant is; its shim announces what it holds (a Hold)
// when the Ledger reaches it. False when m was placed (or refused) already, or cl is no claim.
func (b *ledgerBook) attach(m *member, cl Claim) bool {
	if cl.Memory == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.gone || m.l != nil || m.refused != nil {
		return false
	}
	b.admitLocked(m, cl, true, 0)
	if m.welcomed && m.speaks() {
		m.sendOrDrop(b.ledgerMsgLocked(m))
	}
	return true
}

// welcome sends m its first Ledger; false when the client does not read.
// ledgerAttach places the client m (the kernel's pid), which connected while its pod was unknown, in its
// claim's ledger now that reresolve found the pod.
func (s *Scheduler) ledgerAttach(q *queue, m *member, pid int32) {
	if s.opts.ClaimOf == nil || pid == 0 {
		return
	}
	if cl, ok := s.opts.ClaimOf(q.uuid, pid); ok && s.book(q).attach(m, cl) {
		s.watchContexts(q, s.book(q))
		q.log.Info("Shim client placed in its claim's ledger now that its pod is found", "pid", pid, "claim", cl.Key)
		s.attachPeers(q, m, cl)
	}
}

func (b *ledgerBook) welcome(m *member) bool {
	if !m.speaks() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m.welcomed = true
	return m.send(b.ledgerMsgLocked(m))
}

func (b *ledgerBook) leave(m *member) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m.refused, m.gone = nil, true
	b.leaveLocked(m)
}

// leaveLocked takes m out of its ledger, if any.
func (b *ledgerBook) leaveLocked(m *member) {
	l := m.l
	if l == nil {
		return
	}
	delete(l.members, m)
	l.granted -= m.grant
	l.contexts -= m.ctx
	m.grant, m.l = 0, nil
	if len(l.members) == 0 {
		delete(b.byKey, l.key)
		return
	}
	b.settleLocked(l, false)
	b.pushLocked(l, nil)
}

// charge answers a Charge of m: at least bytes more, at least a chunk while there is room beside unseen
// bytes (ledgerrebuild.go).
func (b *ledgerBook) charge(m *member, seq uint32, bytes, unseen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := m.l
	if l == nil {
		m.sendOrDrop(encodeOwn(Message{Type: MsgCharged, Version: m.version, Seq: seq, Charge: ChargeRefused}))
		return
	}
	m.charged = true
	var room uint64
	if t := l.total(); t > l.granted+unseen {
		room = t - l.granted - unseen
	}
	st, added := ChargeRefused, uint64(0)
	if bytes > 0 && bytes <= room {
		st, added = ChargeOK, min(max(bytes, b.chunk), room)
		m.grant += added
		m.peak = max(m.peak, m.grant)
		l.granted += added
	} else {
		l.refusals++
	}
	b.checkLocked(l)
	m.sendOrDrop(encodeOwn(Message{Type: MsgCharged, Version: m.version, Seq: seq, Charge: st, Added: added,
		Grant: m.grant, Total: l.total(), Granted: l.granted}))
	if added > 0 {
		b.pushLocked(l, m)
	}
}

// giveBack applies a Return of m; an error drops the client (a Hold after its first Charge or Hold). A
// Hold from a refused client admits it only as admitHoldLocked allows; seen: NVML shows its process
// holding memory on the GPU.
func (b *ledgerBook) giveBack(m *member, flags uint32, bytes uint64, seen bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	except := m
	if m.l == nil && m.refused != nil && flags&ReturnHold != 0 {
		if !b.admitHoldLocked(m, bytes, seen) {
			return nil
		}
		except = nil // it learns that it is in
	}
	l := m.l
	if l == nil {
		return nil
	}
	if flags&ReturnHold != 0 {
		if m.charged {
			return fmt.Errorf("%w: a held grant re-announced after the connection's first charge", ErrBadField)
		}
		m.charged = true
		l.granted += bytes - m.grant
		m.grant = bytes
		m.peak = max(m.peak, m.grant)
		b.settleLocked(l, true)
	} else {
		bytes = min(bytes, m.grant)
		m.grant -= bytes
		l.granted -= bytes
		b.settleLocked(l, false)
	}
	b.pushLocked(l, except)
	return nil
}

// settleLocked notes whether l is beyond its total; allowed says the change may take it there (a forced
// admission or a Hold), which no Charge and no admission is.
func (b *ledgerBook) settleLocked(l *ledger, allowed bool) {
	beyond := l.granted > l.total()
	if beyond && allowed {
		l.over = true
	}
	if !beyond {
		l.over = false
	}
	b.checkLocked(l)
}

// checkLocked records a broken invariant: the grants plus the context charges beyond M without a forced
// admission, a Hold or a measured context that put them there, or a sum the ledger counts wrong.
func (b *ledgerBook) checkLocked(l *ledger) {
	var sum uint64
	for m := range l.members {
		sum += m.grant
	}
	if sum != l.granted {
		b.broken = append(b.broken, fmt.Errorf("ledger %s: grants sum to %d, the ledger counts %d", l.key, sum, l.granted))
	}
	var ctxs uint64
	for m := range l.members {
		ctxs += m.ctx
	}
	if ctxs != l.contexts {
		b.broken = append(b.broken, fmt.Errorf("ledger %s: context charges sum to %d, the ledger counts %d", l.key, ctxs, l.contexts))
	}
	if l.granted > l.total() && !l.over {
		b.broken = append(b.broken, fmt.Errorf("ledger %s: grants %d + contexts %d beyond the claim %d", l.key, l.granted, l.contexts, l.claim))
	}
}

// pushLocked sends the ledger to its welcomed version 6 members but except (who learns it otherwise).
func (b *ledgerBook) pushLocked(l *ledger, except *member) {
	for m := range l.members {
		if m != except && m.welcomed && m.speaks() {
			m.sendOrDrop(b.ledgerMsgLocked(m))
		}
	}
}

func (b *ledgerBook) ledgerMsgLocked(m *member) []byte {
	msg := Message{Type: MsgLedger, Version: m.version}
	if l := m.l; l != nil {
		msg.Flags, msg.Processes, msg.Claim, msg.Reserve = LedgerOn, uint32(len(l.members)), l.claim, m.ctx
		msg.Total, msg.Granted, msg.Grant, msg.Bytes = l.total(), l.granted, m.grant, b.chunk
	} else if cl := m.refused; cl != nil {
		// the ledger as it stands without this client: n admitted processes and their grants
		msg.Flags, msg.Claim, msg.Reserve, msg.Total, msg.Bytes = LedgerRefused, cl.Memory, b.reserve, cl.Memory, b.chunk
		if l := b.byKey[cl.Key]; l != nil {
			msg.Processes, msg.Total, msg.Granted = uint32(len(l.members)), l.total(), l.granted
		}
	}
	return encodeOwn(msg)
}

func (m *member) sendOrDrop(f []byte) {
	if !m.send(f) && m.drop != nil {
		m.drop()
	}
}

// encodeOwn encodes a message built here; only a version out of range fails, which serveConn rules out.
func encodeOwn(m Message) []byte {
	b, err := Encode(m)
	if err != nil {
		panic(err)
	}
	return b
}

// keyOf is m's ledger ("": none).
func (b *ledgerBook) keyOf(m *member) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.l == nil {
		return ""
	}
	return m.l.key
}

func (b *ledgerBook) states() []LedgerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]LedgerState, 0, len(b.byKey))
	for _, l := range b.byKey {
		out = append(out, LedgerState{GPU: b.gpu, Key: l.key, Claim: l.claim, Processes: len(l.members),
			Contexts: l.contexts, Total: l.total(), Granted: l.granted, Refusals: l.refusals})
	}
	return out
}

// Ledgers returns every claim ledger of every GPU, ordered by GPU and key.
func (s *Scheduler) Ledgers() []LedgerState {
	var out []LedgerState
	for _, q := range s.queues {
		out = append(out, s.book(q).states()...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GPU != out[j].GPU {
			return out[i].GPU < out[j].GPU
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// ledgerMessage handles a Charge or Return of the client pid; an error drops the client.
func (s *Scheduler) ledgerMessage(q *queue, m *member, pid int32, msg Message) error {
	b := s.book(q)
	if msg.Type == MsgCharge {
		s.measureContexts(q, b, m)
		b.charge(m, msg.Seq, msg.Bytes, s.unannounced(q, b.keyOf(m), pid))
		return nil
	}
	return b.giveBack(m, msg.Flags, msg.Bytes, msg.Flags&ReturnHold != 0 && s.contextSeen(q, pid))
}

// The ledger messages' bodies. Ledger carries in Bytes the chunk the scheduler grants by.
func encodeLedger(p []byte, m Message) {
	switch m.Type {
	case MsgLedger:
		le.PutUint32(p[0:], m.Flags)
		le.PutUint32(p[4:], m.Processes)
		for i, v := range []uint64{m.Claim, m.Reserve, m.Total, m.Granted, m.Grant, m.Bytes} {
			le.PutUint64(p[8+8*i:], v)
		}
	case MsgCharge:
		le.PutUint32(p[0:], m.Seq)
		le.PutUint64(p[8:], m.Bytes)
	case MsgCharged:
		le.PutUint32(p[0:], m.Seq)
		le.PutUint32(p[4:], uint32(m.Charge))
		for i, v := range []uint64{m.Added, m.Grant, m.Total, m.Granted} {
			le.PutUint64(p[8+8*i:], v)
		}
	case MsgReturn:
		le.PutUint32(p[0:], m.Flags)
		le.PutUint64(p[8:], m.Bytes)
	}
}

func decodeLedger(t MsgType, p []byte, m *Message) error {
	switch t {
	case MsgLedger:
		m.Flags, m.Processes = le.Uint32(p[0:]), le.Uint32(p[4:])
		if m.Flags&^(LedgerOn|LedgerRefused) != 0 || m.Flags == LedgerOn|LedgerRefused {
			return fmt.Errorf("ledger flags %#x: %w", m.Flags, ErrBadField)
		}
		m.Claim, m.Reserve, m.Total = le.Uint64(p[8:]), le.Uint64(p[16:]), le.Uint64(p[24:])
		m.Granted, m.Grant, m.Bytes = le.Uint64(p[32:]), le.Uint64(p[40:]), le.Uint64(p[48:])
	case MsgCharge:
		m.Seq, m.Bytes = le.Uint32(p[0:]), le.Uint64(p[8:])
		if le.Uint32(p[4:]) != 0 {
			return fmt.Errorf("charge padding not zero: %w", ErrBadField)
		}
	case MsgCharged:
		m.Seq, m.Charge = le.Uint32(p[0:]), ChargeStatus(le.Uint32(p[4:]))
		if m.Charge > ChargeRefused {
			return fmt.Errorf("charged status %d: %w", m.Charge, ErrBadField)
		}
		m.Added, m.Grant, m.Total, m.Granted = le.Uint64(p[8:]), le.Uint64(p[16:]), le.Uint64(p[24:]), le.Uint64(p[32:])
	case MsgReturn:
		m.Flags, m.Bytes = le.Uint32(p[0:]), le.Uint64(p[8:])
		if m.Flags&^ReturnHold != 0 || le.Uint32(p[4:]) != 0 {
			return fmt.Errorf("return flags %#x: %w", m.Flags, ErrBadField)
		}
	}
	return nil
}
