package scheduler

import "net"

// RefuseNoShare is the reason on gpusharing_scheduler_connections_refused_total of a connection whose
// process Guards.Admit turned away: a process of a pod that holds no share of the GPU.
const RefuseNoShare = "no-share"

// admitted asks Guards.Admit whether the process behind a client, the kernel's pid kpid, may use q's GPU.
// It runs between the client's HELLO and its WELCOME, outside every lock, before any other lookup: a
// refused process costs no class, ledger or gang lookup, and is never counted among the GPU's clients.
// Refused, the connection is counted and closed before any WELCOME; the shim then runs without the lock
// and tries again with back-off (GPUSHARE_RECONNECT_MAX_MS between attempts). kpid 0 (a kernel that names
// no peer) cannot be checked and is refused where Admit is set.
func (s *Scheduler) admitted(conn net.Conn, q *queue, kpid int32) bool {
	if s.opts.Admit == nil {
		return true
	}
	ok, why := false, "the kernel does not name the connecting process"
	if kpid != 0 {
		ok, why = s.opts.Admit(q.uuid, kpid)
	}
	if ok {
		return true
	}
	// Counted before the close, so whoever sees the connection end sees it counted.
	s.metrics.refused.WithLabelValues(q.uuid, RefuseNoShare).Inc()
	_ = conn.Close() // refused: the hello was read, nothing was sent
	// V(1): a refused shim tries again every second or so; Admit's owner names the pod once in a while.
	q.log.V(1).Info("Refusing shim client without a share of this GPU", "pid", kpid, "why", why)
	return false
}
