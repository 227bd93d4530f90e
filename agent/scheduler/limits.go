package scheduler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits on what one connection, or one peer, may take from a GPU's socket. Pods are untrusted: a
// process that opens connections without end, or starts a message and stops mid-way, must cost the
// scheduler a bounded amount and never hold up the GPU's other clients.
const (
	// DefaultFrameTimeout bounds the time from a message's first byte to its last. Messages are at
	// most MaxMsgSize bytes and a shim writes each with one write, so a live client needs microseconds.
	DefaultFrameTimeout = time.Second
	// DefaultMaxConns caps the connections of one GPU socket.
	DefaultMaxConns = 256
	// DefaultMaxConnsPerPeer caps the connections of one peer (its pod where Options.PeerKey names it)
	// on one GPU socket: a shim process holds one, so this is the processes of a pod sharing the GPU.
	DefaultMaxConnsPerPeer = 32
)

// Reasons on gpusharing_scheduler_connections_refused_total and gpusharing_scheduler_clients_dropped_total.
const (
	RefuseSocketLimit = "socket-limit"
	RefusePeerLimit   = "peer-limit"
	DropFrameTimeout  = "frame-timeout"
	DropEvictTimeout  = "evict-timeout"
	DropNoHello       = "no-hello"
	DropProtocolError = "protocol-error"
	reasonLabel       = "reason"
)

// ErrFrameTimeout: a peer started a message and did not finish it in time.
var ErrFrameTimeout = errors.New("message not completed in time")

func newGuardMetrics() (refused, dropped, underReports *prometheus.CounterVec) {
	refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpusharing_scheduler_connections_refused_total",
		Help: "Shim connections closed before any WELCOME, per GPU and reason: the GPU socket or the peer had too many (socket-limit, peer-limit), or the process's pod holds no share of the GPU (no-share).",
	}, []string{"gpu", reasonLabel})
	dropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpusharing_scheduler_clients_dropped_total",
		Help: "Shim connections the scheduler cut off, per GPU and reason (no-hello, frame-timeout, evict-timeout, protocol-error).",
	}, []string{"gpu", reasonLabel})
	underReports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpusharing_scheduler_memory_underreports_total",
		Help: "Memory reports whose residency NVML contradicted (the process holds more); the scheduler accounted NVML's figure, per GPU.",
	}, []string{"gpu"})
	return refused, dropped, underReports
}

// Guards are the scheduler's limits on its untrusted clients and the sources it checks their claims
// against (Options embeds them). Zero values take the defaults; nil sources check nothing.
type Guards struct {
	// FrameTimeout bounds the time from a message's first byte to its last (DefaultFrameTimeout).
	FrameTimeout time.Duration
	// MaxConns caps the connections of one GPU socket (DefaultMaxConns).
	MaxConns int
	// MaxConnsPerPeer caps the connections of one peer on one GPU socket (DefaultMaxConnsPerPeer).
	MaxConnsPerPeer int
	// Admit, when set, says whether the process pid (the kernel's, SO_PEERCRED) may use GPU gpu, and why
	// not (admit.go): the agent admits host processes and the processes of pods holding a share of the GPU.
	// It runs between the client's HELLO and its WELCOME, before the other lookups, and must return within
	// a few hundred milliseconds. Nil admits every process (the standalone scheduler).
	Admit func(gpu string, pid int32) (ok bool, why string)
	// PeerKey names the peer a pid belongs to (the agent: its pod's UID); "" or nil: the pid itself.
	PeerKey func(pid int32) string
	// GangKey names the owner of the client pid whose clients on several GPUs form a gang (gang.go; the
	// agent: its pod's UID; "": none). Nil: its session (/proc/<pid>/stat), for the standalone scheduler.
	// A process that started with GPUSHARE_GANG=off is in no gang whatever it names (gangoptout.go).
	GangKey GangKey
	// ProcRoot is where the clients' processes are seen (the agent's --proc-root); "" is /proc.
	ProcRoot string
	// EvictTimeout bounds how long a client may take to answer an EVICT before it is dropped
	// (DefaultEvictTimeout).
	EvictTimeout time.Duration
	// StallBound is how long a holder's process may stay stopped while someone waits before its lock
	// is revoked (stall.go; DefaultStallBound, negative: never).
	StallBound time.Duration
	// Stopped, when set, says whether the process pid is stopped; nil reads its threads' states and its
	// container's freezer under ProcRoot (procfs.Stopped, procfs.Frozen).
	Stopped func(pid int32) bool
	// OnStallRevoked, when set, is told of each holder revoked because its process was stopped, on the
	// scheduler's timer goroutine; it must not block.
	OnStallRevoked func(StallRevocation)
	// PodPriority, when set, is the resolved priority of the pod the peer pid runs in (its
	// PriorityClass value); ok is false where its pod is unknown. It decides the client's class with
	// GPUConfig.ProductionPriority, and the hello's priority is ignored (priority.go). Nil trusts the
	// hello (the standalone scheduler).
	PodPriority func(pid int32) (value int32, ok bool)
	// ProcessMemory, when set, reads the device memory NVML sees each process of a GPU use
	// (memcheck.go); a client's reported residency is cross-checked against it.
	ProcessMemory func(uuid string) (map[int32]uint64, error)
	// ContextOverhead is the part of a process's NVML figure that is not its swappable allocations
	// (its CUDA context and driver-internal memory), left out when NVML is compared with its reports.
	ContextOverhead uint64
	// ClaimOf, when set, names the claim ledger of the client pid on GPU gpu (ledger.go); ok false: none,
	// the client keeps its own per-process limit. It runs between the client's HELLO and its WELCOME and
	// must return within a few hundred milliseconds.
	ClaimOf func(gpu string, pid int32) (Claim, bool)
	// OnChargeRefused, when set, is told of each Charge a claim's ledger refuses (refused.go), on the
	// client's connection goroutine; it must not block.
	OnChargeRefused func(ChargeRefusal)
	// ContextReserve is R, charged per connected process of a ledger for its CUDA context
	// (DefaultContextReserve).
	ContextReserve uint64
	// ContextFloor is the least a ledger charges a process for its context once NVML has a figure for it
	// (context.go; DefaultContextFloor).
	ContextFloor uint64
	// LedgerChunk is the least a Charge adds to a grant while the ledger has room (DefaultLedgerChunk).
	LedgerChunk uint64
}

// withLimitDefaults fills the limits left zero.
func (o Options) withLimitDefaults() Options {
	if o.FrameTimeout <= 0 {
		o.FrameTimeout = DefaultFrameTimeout
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxConnsPerPeer <= 0 {
		o.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if o.EvictTimeout <= 0 {
		o.EvictTimeout = DefaultEvictTimeout
	}
	if o.StallBound == 0 {
		o.StallBound = DefaultStallBound
	}
	if o.ContextReserve == 0 {
		o.ContextReserve = DefaultContextReserve
	}
	if o.ContextFloor == 0 {
		o.ContextFloor = DefaultContextFloor
	}
	if o.LedgerChunk == 0 {
		o.LedgerChunk = DefaultLedgerChunk
	}
	return o
}

// readFrame reads one message. Waiting for its first byte is unbounded (a client may stay quiet for
// as long as it likes: its lease is its connection); from then on the whole message must arrive within
// timeout, so a peer that stops mid-message is dropped instead of keeping its goroutine and lease.
func readFrame(conn net.Conn, timeout time.Duration) (Message, error) {
	var first [1]byte
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return Message{}, err
	}
	if _, err := io.ReadFull(conn, first[:]); err != nil {
		return Message{}, err
	}
	// Socket deadlines are compared by the kernel with the wall clock: time.Now, not the injected clock.
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return Message{}, err
	}
	m, err := ReadMessage(io.MultiReader(bytes.NewReader(first[:]), conn))
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return Message{}, fmt.Errorf("%w (%v)", ErrFrameTimeout, timeout)
	}
	return m, err
}

// connLimiter counts the connections of each GPU socket and of each peer on it.
type connLimiter struct {
	mu      sync.Mutex
	perSock map[*queue]int
	perPeer map[peerSlot]int
}

type peerSlot struct {
	q    *queue
	peer string
}

// admit takes a slot for a connection of peer on q's socket, or says why it may not have one.
// release gives the slot back.
func (l *connLimiter) admit(q *queue, peer string, o Options) (release func(), refused string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perSock == nil {
		l.perSock, l.perPeer = map[*queue]int{}, map[peerSlot]int{}
	}
	slot := peerSlot{q, peer}
	switch {
	case l.perSock[q] >= o.MaxConns:
		return nil, RefuseSocketLimit
	case l.perPeer[slot] >= o.MaxConnsPerPeer:
		return nil, RefusePeerLimit
	}
	l.perSock[q]++
	l.perPeer[slot]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.perSock[q]--
			if l.perPeer[slot]--; l.perPeer[slot] == 0 {
				delete(l.perPeer, slot)
			}
		})
	}, ""
}

// peerKey names the peer a connection counts against: the pod when Options.PeerKey can name it (a
// pod's processes share one allowance), else the process.
func (s *Scheduler) peerKey(pid int32) string {
	if s.opts.PeerKey != nil {
		if k := s.opts.PeerKey(pid); k != "" {
			return k
		}
	}
	return fmt.Sprintf("pid:%d", pid)
}

// admit takes a connection slot for the peer behind conn, or closes conn and counts the refusal. The
// refused peer sees its connection end before any Welcome and continues in pass-through.
func (s *Scheduler) admit(conn net.Conn, q *queue) (release func(), ok bool) {
	pid := peerPID(conn)
	release, refused := s.lim.admit(q, s.peerKey(pid), s.opts)
	if refused == "" {
		return release, true
	}
	// Counted before the close, so whoever sees the connection end sees it counted.
	s.metrics.refused.WithLabelValues(q.uuid, refused).Inc()
	_ = conn.Close() // refused: nothing was read or sent
	// V(1): a peer opening connections in a loop must not flood the log; the counter says it all.
	q.log.V(1).Info("Refusing shim connection over the limit", "pid", pid, "reason", refused,
		"maxConns", s.opts.MaxConns, "maxConnsPerPeer", s.opts.MaxConnsPerPeer)
	return nil, false
}

// countDrop counts a client cut off by a read error that is not an ordinary end of connection.
func (s *Scheduler) countDrop(q *queue, err error) {
	reason := DropProtocolError
	if errors.Is(err, ErrFrameTimeout) {
		reason = DropFrameTimeout
	}
	s.metrics.dropped.WithLabelValues(q.uuid, reason).Inc()
}
