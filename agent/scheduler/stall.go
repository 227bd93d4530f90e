package scheduler

import (
	"slices"
	"time"

	"github.com/gpusharing/gpusharing/agent/procfs"
)

// A holder whose process is stopped.
//
// A shim releases the lock from its own thread: after its idle window, when its work completed
// (SETTLE), at quantum + grace. A process that is stopped (SIGSTOP or SIGTSTP, a debugger or profiler
// attached to it, a job-control stop) or frozen (its container paused by the runtime, or frozen for a
// checkpoint: procfs.Frozen) runs none of that, and its GPU runs nothing of it either: its submitted
// work finishes and no more comes. Production never yields to an opportunistic waiter, and
// an opportunistic holder keeps its quantum, so without this a production process that a user stops
// keeps every opportunistic pod of the GPU waiting for as long as it stays stopped, and any holder
// keeps every waiter for up to quantum + grace.
//
// So while someone waits (someoneWaitsLocked: a client, a gang that reserved the GPU, or a gang with a
// member on the GPU that waits on another), the scheduler looks at its holders' processes every
// stallCheckEvery; one seen stopped for StallBound is revoked (REVOKED, as at
// quantum + grace; a gang's turn ends on all its GPUs) and the GPU goes to the waiters. Once the
// process runs again, its shim reads the REVOKED and asks again at its next call; a production client
// then preempts at once. What it launches between its resumption and that read (the shim's thread
// reads within a few milliseconds) runs beside the new holder, as after any revocation: the lock is
// cooperative. A process that runs but keeps the lock without using the GPU is bounded by quantum +
// grace where a client of its class waits.

// DefaultStallBound is how long a holder's process may stay stopped while someone waits before the
// scheduler revokes its lock: long enough that a process the kernel only briefly shows stopped (a
// debugger's single step, a profiler's sample) keeps it, short against the soak's idle bound (2 s,
// docs/reliability.md).
const DefaultStallBound = 500 * time.Millisecond

// stallCheckEvery is how often the holders' processes are read while someone waits.
const stallCheckEvery = 100 * time.Millisecond

// gangEndStalled: a member's process was stopped while others waited.
const gangEndStalled = "stalled"

// stoppedFunc is Guards.Stopped, or a read of the process under ProcRoot: its threads stopped, or its
// container's cgroup frozen.
func (s *Scheduler) stoppedFunc() func(int32) bool {
	if s.opts.Stopped != nil {
		return s.opts.Stopped
	}
	root := s.procRoot()
	return func(pid int32) bool {
		if stopped, err := procfs.Stopped(root, int(pid)); err == nil && stopped {
			return true
		}
		frozen, err := procfs.Frozen(root, int(pid))
		return err == nil && frozen
	}
}

// someoneWaitsLocked: a client waits on q, a gang reserved q and waits for its holders, or a gang with
// a member on q waits on another GPU (it takes its turn on all its GPUs at once, so q's holder keeps it
// waiting too).
func (q *queue) someoneWaitsLocked() bool {
	if q.nWaitingLocked() > 0 || q.gangs.claimantLocked(q) != nil {
		return true
	}
	if !q.gangs.active() {
		return false // no gang formed: nothing waits elsewhere for q
	}
	for _, c := range q.clients {
		if g := gangOf(c); g != nil && slices.ContainsFunc(g.members, func(m *client) bool { return m.state == stateWaiting }) {
			return true
		}
	}
	return false
}

// watchStallsLocked arms the next look at q's holders, and at those of the other GPUs of the gangs
// that wait on q, where they have holders and someone waits.
func (q *queue) watchStallsLocked() {
	q.armStallWatchLocked()
	if !q.gangs.active() {
		return // every dispatch ends here: the scan below is for gangs alone
	}
	for _, c := range q.clients {
		if g := gangOf(c); g != nil && c.state == stateWaiting {
			for _, o := range g.gpus() {
				o.armStallWatchLocked()
			}
		}
	}
}

func (q *queue) armStallWatchLocked() {
	if q.stallBound <= 0 || q.stopped == nil || q.stallTimer != nil || len(q.holders) == 0 || !q.someoneWaitsLocked() {
		return
	}
	q.stallTimer = q.clock.AfterFunc(stallCheckEvery, q.checkStalls)
}

// checkStalls reads the holders' processes (outside the lock: a read of /proc may be slow on a loaded
// node) and revokes those seen stopped for stallBound.
func (q *queue) checkStalls() {
	type hold struct {
		c     *client
		epoch uint32
		pid   int32
	}
	q.mu.Lock()
	q.stallTimer = nil
	if !q.someoneWaitsLocked() {
		for _, h := range q.holders {
			h.stoppedSince = time.Time{} // a stop counts only while it keeps someone waiting
		}
		q.mu.Unlock()
		return
	}
	holds := make([]hold, 0, len(q.holders))
	for _, h := range q.holders {
		holds = append(holds, hold{h, h.epoch, h.pid})
	}
	stopped := q.stopped
	q.mu.Unlock()

	seen := make([]bool, len(holds))
	for i, h := range holds {
		seen[i] = stopped(h.pid)
	}

	q.mu.Lock()
	now := q.clock.Now()
	var revoked []StallRevocation
	for i, h := range holds {
		c := h.c
		if !c.state.granted() || c.epoch != h.epoch {
			continue // released, revoked or gone meanwhile
		}
		switch {
		case !seen[i]:
			c.stoppedSince = time.Time{}
		case c.stoppedSince.IsZero():
			c.stoppedSince = now
		case now.Sub(c.stoppedSince) >= q.stallBound && q.someoneWaitsLocked():
			revoked = append(revoked, q.revokeStoppedLocked(c, now))
		}
	}
	if len(revoked) > 0 {
		q.dispatchLocked(nil)
	}
	q.watchStallsLocked()
	tell := q.onStall
	q.mu.Unlock()
	if tell != nil {
		for _, r := range revoked {
			tell(r)
		}
	}
}

// StallRevocation is one holder revoked because its process was stopped while others waited
// (Guards.OnStallRevoked).
type StallRevocation struct {
	GPU   string
	PID   int32
	Class Class
	// Stopped is how long its process had been seen stopped, Held how long it had held the lock.
	Stopped, Held time.Duration
}

// revokeStoppedLocked takes the lock from c, whose process has been stopped since c.stoppedSince.
func (q *queue) revokeStoppedLocked(c *client, now time.Time) StallRevocation {
	r := StallRevocation{GPU: q.uuid, PID: c.pid, Class: c.class, Stopped: now.Sub(c.stoppedSince), Held: now.Sub(c.grantedAt)}
	q.stalls.Inc()
	q.log.Info("Revoking the GPU lock of a holder whose process is stopped while others wait", "client", c.id,
		"pid", c.pid, "class", c.class, "stopped", r.Stopped.Round(time.Millisecond), "held", r.Held.Round(time.Millisecond))
	if g := gangOf(c); g != nil && g.state != gangIdle {
		q.gangs.endTurnLocked(g, gangEndStalled)
		return r
	}
	c.revocations++
	q.revocations.Inc()
	q.sendLocked(c, Message{Type: MsgRevoked, Epoch: c.epoch})
	q.endHoldLocked(c)
	return r
}
