package scheduler

import (
	"fmt"
	"os"
	"time"
)

// Restarts. A scheduler keeps its account in memory only, so after it (or
// the agent it runs in) restarts it knows nothing of the processes still
// running on its GPUs: which of them hold device memory, and how much. The
// shims reconnect with backoff and, right after Welcome, re-announce
// themselves with a Rejoin carrying their memory state; the account is
// rebuilt from those reports.
//
// To keep a re-announcing process's memory from being handed to another
// before its report arrives, a scheduler that finds its socket left by a
// previous run (a killed scheduler leaves it), or the restart mark a previous
// one's Close left when it dropped clients or had not finished a rebuild of its
// own (<socket>.restart), grants nothing for a rebuild window (Options.RebuildWindow, default
// DefaultRebuildWindow): long enough for every live shim to reconnect, whose
// backoff between attempts is at most 1 s (GPUSHARE_RECONNECT_MAX_MS) plus a
// connect timeout of 1 s. Requests that arrive meanwhile wait in line and are
// served, in order, when the window ends. A scheduler starting on a socket
// path that never served (a fresh node) has nobody to wait for and grants at
// once.
//
// What is trusted: a Rejoin is accepted once per connection and only as its
// first message after Hello; its resident bytes become the client's
// reservation, capped at the GPU's budget: the one exception to the budget
// rule (checkBudget). The sum may then exceed the budget (the memory is
// physically there, or the client lies about it and loses that much of the
// budget to itself).

// DefaultRebuildWindow is how long a restarted scheduler holds every grant.
const DefaultRebuildWindow = 3 * time.Second

// RejoinHeld is Rejoin.Flags' bit: the client held the GPU when its previous connection ended.
const RejoinHeld uint32 = 1

func encodeRejoin(p []byte, m Message) {
	le.PutUint32(p[0:], m.Flags)
	le.PutUint64(p[8:], m.Need)
	le.PutUint64(p[16:], m.Resident)
	le.PutUint64(p[24:], m.Stats.Swapped)
}

func decodeRejoin(p []byte, m *Message) error {
	m.Flags = le.Uint32(p[0:])
	if m.Flags&^RejoinHeld != 0 || le.Uint32(p[4:]) != 0 {
		return fmt.Errorf("rejoin flags %#x: %w", m.Flags, ErrBadField)
	}
	m.Need = le.Uint64(p[8:])
	m.Resident = le.Uint64(p[16:])
	m.Stats.Swapped = le.Uint64(p[24:])
	return nil
}

// rebuildState is a queue's rebuild window.
type rebuildState struct {
	until time.Time // no grant before this
}

// restartMark is the file Close leaves next to a socket whose clients it dropped.
func restartMark(sock string) string { return sock + ".restart" }

// leftByPreviousRun reports whether a previous scheduler served path and may
// have left clients running, holding memory this one must learn of: its socket
// is still there (it was killed), or its Close left the restart mark (consumed
// here).
func leftByPreviousRun(path string) bool {
	marked := os.Remove(restartMark(path)) == nil
	fi, err := os.Lstat(path)
	return marked || (err == nil && fi.Mode()&os.ModeSocket != 0)
}

// markRestartLocked leaves the restart mark of every served socket (s.mu held).
// Best effort: without it the next scheduler grants at once, as on a fresh node.
func (s *Scheduler) markRestartLocked() {
	for _, g := range s.cfgs {
		if f, err := os.OpenFile(restartMark(g.SocketPath), os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_ = f.Close()
		}
	}
}

// rebuildUnsettled: a GPU's rebuild window lasts, or a process NVML listed at the restart is not back
// yet (ledgerrebuild.go). Closed now, the scheduler leaves the restart mark as if it dropped clients:
// the processes of the run before it are still out there, and the next scheduler must wait for them
// and count them as this one does.
func (s *Scheduler) rebuildUnsettled() bool {
	for _, q := range s.queues {
		if q.rebuilding() || s.book(q).earlier.any() {
			return true
		}
	}
	return false
}

// startRebuild holds every grant for d.
func (q *queue) startRebuild(d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rebuild.until = q.clock.Now().Add(d)
	q.log.Info("Restarted on a socket left by a previous scheduler: holding grants while clients re-announce",
		"window", d)
	q.armRetryLocked(d)
}

// rebuildingLocked is true while the rebuild window lasts; a dispatch is then
// re-run when it ends.
func (q *queue) rebuildingLocked() bool {
	left := q.rebuild.until.Sub(q.clock.Now())
	if left <= 0 {
		return false
	}
	q.armRetryLocked(left)
	return true
}

// overLocked is how far the reservations exceed the budget (after
// re-announced memory that did not fit): evictions must free that much too
// before anything more is reserved.
func (q *queue) overLocked() uint64 {
	if q.reserved <= q.budget {
		return 0
	}
	return q.reserved - q.budget
}

// rejoin accounts a reconnected client's memory (see the comment at the top).
func (q *queue) rejoin(c *client, m Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.rejoined || c.state != stateIdle || c.grants > 0 || c.raises > 0 || c.reported.Type != 0 {
		q.log.Info("Dropping shim client that re-announced itself after other messages", "client", c.id, "pid", c.pid)
		c.drop()
		return
	}
	c.rejoined = true
	q.log.Info("Shim client re-announced itself", "client", c.id, "pid", c.pid, "heldBefore", m.Flags&RejoinHeld != 0,
		"need", m.Need, "resident", m.Resident, "swapped", m.Stats.Swapped)
	c.reported = Message{Type: MsgUsage, Need: m.Need, Resident: m.Resident, Stats: SwapStats{Swapped: m.Stats.Swapped}}
	if q.budget == 0 {
		return // the lock only: nothing to account
	}
	res := min(m.Resident, q.budget)
	c.need = res
	q.reserveLocked(c, res, true)
	if q.reserved > q.budget {
		q.log.Info("Re-announced memory exceeds the budget; nothing more is granted until it is evicted or released",
			"reserved", q.reserved, "budget", q.budget)
	}
	q.dispatchLocked(nil)
}
