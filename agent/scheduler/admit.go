package scheduler

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// RefuseNoShare is the reason on gpusharing_scheduler_connections_refused_total of a connection whose
// process Guards.Admit turned away: a process of a pod that holds no share of the GPU.
const RefuseNoShare = "no-share"

// fallbackWindow is how long a refusal at one protocol version also refuses the same process's HELLOs
// of older versions. A shim whose connection closes at its HELLO takes the scheduler for an older one and
// greets again one version lower, within its connect deadline (GPUSHARE_CONNECT_TIMEOUT_MS, 1 s by
// default): admitted at such a greeting (its pod found in the meantime), it would speak the older
// protocol, without a claim ledger, for the life of its connection. Refused whole, the attempt ends and
// the shim's next one, a moment later, greets in its own version again.
const fallbackWindow = 5 * time.Second

// RepeatWindow is how long a refusal also refuses the same process's HELLOs of the same version: a shim
// greets each version three times, 20 ms apart, before it takes a close for a refusal of that version
// (shim/src/conn.c: one close may be a scheduler shutting down), and those greetings are one attempt,
// which costs one lookup. Its next attempt comes after its reconnect back-off, later than this.
const RepeatWindow = 150 * time.Millisecond

// refusals remembers the latest refused HELLO of each process on each GPU socket.
type refusals struct {
	mu sync.Mutex
	m  map[refusalKey]refusal
}

type refusalKey struct {
	q   *queue
	pid int32
}

type refusal struct {
	version uint16
	at      time.Time
}

// fallback says whether a HELLO of version from pid belongs to an attempt refused already: an older
// greeting within fallbackWindow of a refusal at a newer version, or the same version again within
// RepeatWindow.
func (r *refusals) fallback(q *queue, pid int32, version uint16, now time.Time) (refusal, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.m[refusalKey{q, pid}]
	since := now.Sub(last.at)
	return last, ok && (version < last.version && since < fallbackWindow || version == last.version && since < RepeatWindow)
}

// record notes a refusal of pid's HELLO of version, and forgets those older than fallbackWindow.
func (r *refusals) record(q *queue, pid int32, version uint16, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[refusalKey]refusal{}
	}
	for k, v := range r.m {
		if now.Sub(v.at) >= fallbackWindow {
			delete(r.m, k)
		}
	}
	r.m[refusalKey{q, pid}] = refusal{version, now}
}

// admitted asks Guards.Admit whether the process behind a client, the kernel's pid kpid, may use q's GPU.
// It runs between the client's HELLO (of version) and its WELCOME, outside every lock, before any other
// lookup: a refused process costs no class, ledger or gang lookup, and is never counted among the GPU's
// clients. Refused, the connection is counted and closed before any WELCOME; the shim then runs without
// the lock and tries again with back-off (GPUSHARE_RECONNECT_MAX_MS between attempts). kpid 0 (a kernel
// that names no peer) cannot be checked and is refused where Admit is set.
func (s *Scheduler) admitted(conn net.Conn, q *queue, kpid int32, version uint16) bool {
	if s.opts.Admit == nil {
		return true
	}
	if version == 0 {
		version = Version // a frame of the current version decodes as 0
	}
	now := s.opts.Clock.Now()
	var ok bool
	var why string
	switch last, older := s.refused.fallback(q, kpid, version, now); {
	case kpid == 0:
		why = "the kernel does not name the connecting process"
	case older:
		why = fmt.Sprintf("refused at protocol %d %v ago; this greeting is the same attempt", last.version, now.Sub(last.at))
	default:
		if ok, why = s.opts.Admit(q.uuid, kpid); !ok {
			s.refused.record(q, kpid, version, now)
		}
	}
	if ok {
		return true
	}
	// Counted before the close, so whoever sees the connection end sees it counted.
	s.metrics.refused.WithLabelValues(q.uuid, RefuseNoShare).Inc()
	_ = conn.Close() // refused: the hello was read, nothing was sent
	// V(1): a refused shim tries again every second or so; Admit's owner names the pod once in a while.
	q.log.V(1).Info("Refusing shim client without a share of this GPU", "pid", kpid, "version", version, "why", why)
	return false
}
