// Package scheduler is the node agent's per-GPU lock server for the shim
// (shim/, libgpushare.so). Each GPU has its own queue on its own Unix socket;
// a client is one process, its lease is its connection, and the protocol is
// defined in shim/include/gpushare_proto.h (mirrored in proto.go).
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// GPUConfig is one GPU's queue.
type GPUConfig struct {
	// UUID identifies the GPU; a client that names another uuid is refused.
	UUID string
	// SocketPath is the Unix socket the shim connects to (GPUSHARE_SOCKET).
	SocketPath string
	// Quantum is how long a holder may keep the lock while others wait.
	Quantum time.Duration
	// Grace is how long past its quantum (and past learning that others wait)
	// a holder may take to drain its GPU work before it is revoked.
	Grace time.Duration
	// Budget is the device memory, in bytes, that the shim clients of this GPU
	// may have physically resident together (GPU memory minus a reserve, or
	// what the policy sets). 0: the lock only, no memory accounting.
	Budget uint64
	// Mode is the anti-thrashing policy when Budget > 0 (default ModeAuto).
	Mode Mode
	// SerialHandoffs grants a waiter only once all it needs is free, as for a
	// version 2 client: the leaver's copy-out and the newcomer's copy-in run
	// one after the other instead of overlapped (fill.go). Slower; it exists
	// to measure each direction of a swap alone (bench-oversub's swap section).
	SerialHandoffs bool
	// ProductionPriority is the lowest pod priority (the pod's resolved PriorityClass value) whose
	// clients are production (qos.go); nil: none is, every client is opportunistic. It applies where
	// Options.PodPriority names pods; without it the hello decides.
	ProductionPriority *int32
	// OpportunisticQueue is the launches an opportunistic client may keep outstanding on the GPU while
	// a production client is busy (busy.go; PACE; 0: DefaultOpportunisticQueue). It holds for clients
	// before version 7, and for all where OpportunisticQueueTime is negative.
	OpportunisticQueue uint32
	// OpportunisticQueueTime is the GPU time an opportunistic client may keep outstanding while a
	// production client is busy (PACE_TIME, version 7): 0 is DefaultOpportunisticQueueTime, a negative
	// value leaves the count bound (OpportunisticQueue) alone.
	OpportunisticQueueTime time.Duration
	// SettleFloor is how long a production client waits without a GPU call, once its submitted work
	// completed, before it releases while an opportunistic client is busy (SETTLE, version 7): 0 is
	// DefaultSettleFloor, a negative value turns the release on completion off (the idle window alone).
	SettleFloor time.Duration
}

// Options configure a Scheduler.
type Options struct {
	GPUs []GPUConfig
	// Clock defaults to RealClock.
	Clock Clock
	// Registerer receives the metrics; nil leaves them unregistered. Ignored
	// when Metrics is set.
	Registerer prometheus.Registerer
	// Metrics, when set, are series already registered (NewMetrics) that this
	// Scheduler shares with others instead of registering its own.
	Metrics *Metrics
	// OnClientsChange, when set, is called after a client of a GPU connects
	// (its hello accepted) or disconnects, or reports another launch bound in
	// force, so an owner can publish the client set without polling. It runs on
	// the connection's goroutine and must not block.
	OnClientsChange func(gpu string)
	// HelloTimeout bounds how long a new connection may take to say hello (default 2s).
	HelloTimeout time.Duration
	// WriteTimeout bounds one write to a client (default 1s); a client that
	// does not read is dropped, freeing the lock if it held it.
	WriteTimeout time.Duration
	// RebuildWindow is how long a scheduler restarted on a socket left by a
	// previous run grants nothing while its clients re-announce their memory
	// (rebuild.go; default DefaultRebuildWindow, negative: none).
	RebuildWindow time.Duration
	// EnvOverrides lets the clients' environments loosen their pacing and waits (GPUSHARE_PACE_OVERRIDE
	// and its siblings; Policy, liveness.go): for benchmarks on the standalone scheduler, never for pods.
	EnvOverrides bool
	// Gangs, when set, coordinates this Scheduler's GPUs with other Schedulers' (the agent runs one per
	// GPU): a gang spans the GPUs of the Schedulers that share it (gang.go). Nil: a Gangs of its own.
	Gangs *Gangs
	// Guards limit what one client may take and check what it claims (limits.go).
	Guards
}

// ClientState is what the agent publishes about one shim client.
type ClientState struct {
	GPU         string
	ID          uint32
	PID         int32 // from SO_PEERCRED when available (host pid), else as the client reported it
	Class       Class // production or opportunistic (qos.go)
	Holding     bool
	Waiting     bool
	Waits       uint64        // acquisitions that had to wait for another holder
	WaitTime    time.Duration // total time spent waiting, including a wait in progress
	HoldTime    time.Duration // total time holding, including a hold in progress
	Grants      uint64
	Revocations uint64
	Preemptions uint64 // holds ended at once for a production client
	ConnectedAt time.Time

	// Memory, when the GPU has a budget.
	NeedBytes     uint64        // working set it asked to run with
	ReservedBytes uint64        // bytes it may have resident (the scheduler's account)
	ResidentBytes uint64        // as last reported by the client
	SwappedBytes  uint64        // in host staging, as last reported
	SwapOuts      uint64        // allocations copied out and released
	SwapIns       uint64        // allocations mapped and copied back in
	BytesOut      uint64        // bytes copied out
	BytesIn       uint64        // bytes copied in
	SwapTime      time.Duration // time spent swapping
	Evictions     uint64        // evictions the scheduler asked of it

	// The launch bound in force as the client last reported it (protocol 6, liveness.go): PacingKnown
	// once it did; LaunchBound 0 is unbounded, PacingState says where the bound comes from.
	PacingKnown bool
	LaunchBound uint32
	PacingState PacingState
	// Pings counts the liveness questions of a waiting client the scheduler answered.
	Pings uint64
	// Gang names its gang (its pod or session; gang.go) while it has peers on other GPUs, else "".
	Gang string
}

// GPUState is one GPU's memory account.
type GPUState struct {
	GPU               string
	Quantum           time.Duration // in force: what the next grant carries
	Grace             time.Duration
	Budget            uint64
	Mode              Mode
	ReservedBytes     uint64 // sum of the clients' reservations: within Budget but after a restart or a lowered Budget (checkBudget)
	PeakReservedBytes uint64 // highest ReservedBytes since start
	Holders           int
	Waiters           int
	// ProductionPriority, OpportunisticQueue, OpportunisticQueueTime and SettleFloor are GPUConfig's, in
	// force (with their defaults; 0 for the last two: off).
	ProductionPriority     *int32
	OpportunisticQueue     uint32
	OpportunisticQueueTime time.Duration
	SettleFloor            time.Duration
}

// Defaults for GPUConfig fields left zero.
const (
	DefaultQuantum = 20 * time.Second // the CRD's default timeQuantum: one figure wherever a quantum is left unset
	MinGrace       = 100 * time.Millisecond
)

// ErrInvalidConfig wraps every configuration error New returns.
var ErrInvalidConfig = errors.New("invalid scheduler configuration")

// Scheduler serves one lock queue per GPU.
type Scheduler struct {
	opts    Options
	metrics *Metrics
	queues  []*queue
	cfgs    []GPUConfig // under mu once serving (Reconfigure)

	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
	lim       connLimiter
	procMem   procMemCache
	refused   refusals // the HELLOs Guards.Admit refused lately (admit.go)
	books     sync.Map // *queue -> *ledgerBook, its claim ledgers (ledger.go)
	peers     peerLedgers
	// peerPIDOf is peerPID; tests stand in a kernel that gives no pid.
	peerPIDOf func(net.Conn) int32
	// gangKeyOf names the gang of the client whose kernel pid is kpid (Options.GangKey); tests name
	// gangs of clients that all run in the test's process from their hellos.
	gangKeyOf func(kpid int32, hello Message) string
}

// New validates the options and registers the metrics.
func New(opts Options) (*Scheduler, error) {
	if len(opts.GPUs) == 0 {
		return nil, fmt.Errorf("%w: no GPUs", ErrInvalidConfig)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.HelloTimeout == 0 {
		opts.HelloTimeout = 2 * time.Second
	}
	if opts.WriteTimeout == 0 {
		opts.WriteTimeout = time.Second
	}
	if opts.RebuildWindow == 0 {
		opts.RebuildWindow = DefaultRebuildWindow
	}
	opts = opts.withLimitDefaults()
	m := opts.Metrics
	if m == nil {
		var err error
		if m, err = newMetrics(opts.Registerer); err != nil {
			return nil, fmt.Errorf("registering scheduler metrics: %w", err)
		}
	}
	s := &Scheduler{opts: opts, metrics: m, conns: map[net.Conn]struct{}{}, peerPIDOf: peerPID}
	s.gangKeyOf = func(kpid int32, _ Message) string { return s.gangKey(kpid) }
	co := opts.Gangs
	if co == nil {
		co = NewGangs()
	}
	seen := map[string]bool{}
	for _, g := range opts.GPUs {
		if g.UUID == "" || g.SocketPath == "" {
			return nil, fmt.Errorf("%w: GPU %q needs a uuid and a socket path", ErrInvalidConfig, g.UUID)
		}
		if seen[g.UUID] || seen["sock:"+g.SocketPath] {
			return nil, fmt.Errorf("%w: GPU %q or socket %q given twice", ErrInvalidConfig, g.UUID, g.SocketPath)
		}
		seen[g.UUID], seen["sock:"+g.SocketPath] = true, true
		g = g.WithDefaults()
		if g.Mode > ModeOff {
			return nil, fmt.Errorf("%w: GPU %q anti-thrashing mode %d", ErrInvalidConfig, g.UUID, g.Mode)
		}
		s.cfgs = append(s.cfgs, g)
		q := newQueue(g, opts.Clock, m, logr.Discard())
		q.evictTimeout = opts.EvictTimeout
		q.stallBound, q.stopped, q.onStall = opts.StallBound, s.stoppedFunc(), opts.OnStallRevoked
		q.envOverrides = opts.EnvOverrides
		q.useGangs(co, opts.Clock, m)
		s.queues = append(s.queues, q)
	}
	m.attach(s)
	return s, nil
}

// WithDefaults returns g with a zero quantum, grace, opportunistic queue, queue time and settle floor
// set to their defaults: DefaultQuantum, max(quantum/2, MinGrace), DefaultOpportunisticQueue,
// DefaultOpportunisticQueueTime and DefaultSettleFloor.
func (g GPUConfig) WithDefaults() GPUConfig {
	if g.Quantum <= 0 {
		g.Quantum = DefaultQuantum
	}
	if g.Grace <= 0 {
		g.Grace = max(g.Quantum/2, MinGrace)
	}
	if g.OpportunisticQueue == 0 {
		g.OpportunisticQueue = DefaultOpportunisticQueue
	}
	if g.OpportunisticQueueTime == 0 {
		g.OpportunisticQueueTime = DefaultOpportunisticQueueTime
	}
	if g.SettleFloor == 0 {
		g.SettleFloor = DefaultSettleFloor
	}
	return g
}

// Reconfigure changes a served GPU's quantum, grace, budget, mode, production
// threshold and opportunistic queue in place,
// keeping its socket and its clients' leases: restarting would drop every
// connected process into running without the lock until it reconnects, and
// hold every grant for the rebuild window (rebuild.go).
//
// The quantum reaches connected clients with their next grant (a grant carries
// it) and a revocation deadline armed after the change; mode and budget apply
// to the next hand-off. A client learns the budget once, at hello, so one
// already connected keeps sizing itself by the old budget (cuMemGetInfo, its
// own cap) while the scheduler accounts against the new one: a raise it does
// not use, a cut it meets as waits and out-of-memory on growth beyond it.
// Reservations above a lowered budget are never revoked; they shrink as their
// holders release and are evicted. A new production threshold classifies the
// connected clients again (qos.go): a waiter moves to its new class's line in
// the order of its wait, a holder keeps its hold (an opportunistic one beside
// a production one is preempted), and PACE follows. A change between no budget and a budget
// drops the GPU's clients: they reconnect, and one whose memory was set up as
// swappable at hello continues in pass-through when the budget is gone.
func (s *Scheduler) Reconfigure(g GPUConfig) error {
	g = g.WithDefaults()
	if g.Mode > ModeOff {
		return fmt.Errorf("%w: GPU %q anti-thrashing mode %d", ErrInvalidConfig, g.UUID, g.Mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.queues {
		if s.cfgs[i].UUID != g.UUID {
			continue
		}
		if g.SocketPath != s.cfgs[i].SocketPath {
			return fmt.Errorf("%w: GPU %q socket %q cannot move to %q while serving", ErrInvalidConfig, g.UUID, s.cfgs[i].SocketPath, g.SocketPath)
		}
		s.cfgs[i] = g
		q.reconfigure(g)
		return nil
	}
	return fmt.Errorf("%w: GPU %q is not served by this scheduler", ErrInvalidConfig, g.UUID)
}

// Run listens on every GPU's socket and serves until ctx ends; then it closes
// every connection (clients run without the lock and reconnect).
func (s *Scheduler) Run(ctx context.Context) error {
	if err := s.Listen(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	s.Close()
	return nil
}

// Listen opens the sockets and starts serving in the background; Close stops.
func (s *Scheduler) Listen(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("gpu-scheduler")
	s.mu.Lock()
	cfgs := append([]GPUConfig(nil), s.cfgs...)
	s.mu.Unlock()
	for i, g := range cfgs {
		q := s.queues[i]
		q.mu.Lock()
		q.log = log.WithValues("gpu", g.UUID)
		q.mu.Unlock()
		restarted := leftByPreviousRun(g.SocketPath)
		ln, err := listenUnix(g.SocketPath)
		if err != nil {
			s.Close()
			return fmt.Errorf("GPU %s: %w", g.UUID, err)
		}
		if restarted && s.opts.RebuildWindow > 0 {
			q.startRebuild(s.opts.RebuildWindow)
			s.noteEarlier(q) // ledgerrebuild.go
		}
		s.mu.Lock()
		s.listeners = append(s.listeners, ln)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.acceptLoop(ln, q)
		}()
		st := q.gpuState()
		log.Info("Serving GPU lock", "gpu", g.UUID, "socket", g.SocketPath, "quantum", g.Quantum, "grace", g.Grace,
			"budget", g.Budget, "mode", g.Mode, "opportunisticQueue", st.OpportunisticQueue,
			"opportunisticQueueTime", st.OpportunisticQueueTime, "settleFloor", st.SettleFloor)
	}
	return nil
}

// Close stops accepting, drops every client and removes the sockets (leaving
// a restart mark when it dropped clients, or its own rebuild is not over, rebuild.go). Clients see their
// connection end, run without the lock and reconnect with backoff.
//
// The listeners close before the clients are dropped: a shim reconnects the moment its connection ends,
// and a listener still open would take it in only for the accept loop to close it at its HELLO, which
// is how an older scheduler refuses a protocol version it does not speak (shim/src/conn.c).
func (s *Scheduler) Close() {
	unsettled := s.rebuildUnsettled() // rebuild.go
	s.mu.Lock()
	lns := s.listeners
	s.listeners = nil
	if len(s.conns) > 0 || unsettled {
		s.markRestartLocked()
	}
	for _, ln := range lns {
		_ = ln.Close() // a closed UnixListener removes its socket file
	}
	for c := range s.conns {
		_ = c.Close() // the client is gone either way
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.metrics.detach(s)
}

// Snapshot returns every client of every GPU, ordered by GPU then client id.
func (s *Scheduler) Snapshot() []ClientState {
	var out []ClientState
	for _, q := range s.queues {
		out = append(out, q.snapshot()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].GPU < out[j].GPU })
	return out
}

// GPUs returns each GPU's memory account, in configuration order.
func (s *Scheduler) GPUs() []GPUState {
	out := make([]GPUState, 0, len(s.queues))
	for _, q := range s.queues {
		out = append(out, q.gpuState())
	}
	return out
}

// listenUnix replaces a stale socket left by a previous run, never any other file.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// Clients run as any user inside their pods, so any uid must be able to
	// connect; who may use the GPU is decided per connection, from the
	// peer's pid (Guards.Admit), not by the file's mode.
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return ln, nil
}

func (s *Scheduler) acceptLoop(ln net.Listener, q *queue) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			q.log.Error(err, "Accepting a shim connection")
			time.Sleep(10 * time.Millisecond)
			continue
		}
		release, ok := s.admit(conn, q)
		if !ok {
			continue
		}
		s.mu.Lock()
		if s.listeners == nil {
			s.mu.Unlock()
			release()
			_ = conn.Close()
			return
		}
		s.conns[conn] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer release()
			s.serveConn(conn, q)
			s.mu.Lock()
			delete(s.conns, conn)
			s.mu.Unlock()
		}()
	}
}

// peerPID is the connecting process's pid as the kernel sees it from here.
func peerPID(conn net.Conn) int32 {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int32
	_ = raw.Control(func(fd uintptr) {
		if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = cred.Pid
		}
	})
	return pid
}

// serveConn runs one client: hello, then acquire/release until the
// connection ends or the peer misbehaves; either way its lease ends with it.
func (s *Scheduler) serveConn(conn net.Conn, q *queue) {
	defer func() { _ = conn.Close() }()
	hello, ok := s.readHello(conn, q)
	if !ok {
		return
	}
	kpid := s.peerPIDOf(conn)
	if !s.admitted(conn, q, kpid, hello.Version) {
		return
	}
	pid := kpid
	if pid == 0 {
		pid = int32(hello.PID) // its word: shown, never used to choose its pod (classSource)
	}

	w := startConnWriter(conn, s.opts.WriteTimeout)
	src := s.classSource(kpid, hello.Priority)
	lm, send := s.ledgerJoin(q, kpid, hello.Version, w.send, w.drop)
	defer s.book(q).leave(lm)
	defer s.peerLeft(lm)
	c := q.join(pid, src, hello.Version, send, w.drop)
	gang := s.gangKeyOf(kpid, hello)
	q.joinGang(c, gang)
	q.log.V(1).Info("Shim client connected", "client", c.id, "pid", pid, "class", q.className(c), "gang", gang)
	s.clientsChanged(q.uuid)
	classKnown := !src.fromPod || src.known
	if kpid != 0 && (!classKnown || s.claimPending(q, lm)) {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.reresolve(q, c, lm, kpid, hello.Priority, classKnown, w.done)
		}()
	}
	s.readClient(conn, q, c, lm, pid, hello.Version)
	q.leave(c)
	w.stop()
	q.log.V(1).Info("Shim client disconnected", "client", c.id, "pid", pid)
	s.clientsChanged(q.uuid)
}

func (s *Scheduler) clientsChanged(gpu string) {
	if s.opts.OnClientsChange != nil {
		s.opts.OnClientsChange(gpu)
	}
}
