package soak

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpusharing/gpusharing/agent/app"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// The invariants' stated bounds.
const (
	// connectBound: a process with a context is a client of its GPU's scheduler, and in its pod's ledger,
	// within this long (of its context, of the scheduler's restart, of a failed lookup's end, of its
	// continuing after a stall). It covers the shim's reconnect back-off (1 s) and the scheduler's pod
	// lookups retried from 0.5 s, doubling.
	connectBound = 10 * time.Second
	// idleBound: no GPU grants nobody but stopped processes this long while a client that is not
	// stopped waits (the shim's 50 ms idle window, or the scheduler's stall bound and its reads, plus the
	// hand-off and a loaded machine's slack).
	idleBound = 2 * time.Second
	// productionBound: a production client waits at most this long (an opportunistic holder is revoked at
	// once and has grace to drain; one that does not answer is dropped at evictTimeout).
	productionBound = grace + evictTimeout + 2*time.Second
	// settleBound: when every client has gone, ledgers, reservations and accounts are zero within this.
	settleBound = 10 * time.Second
	// unmanagedBound: a process that dropped the shim and holds a context is named unmanaged within this
	// (of its drop, or of the lookups answering again): the guard's stated bound (its grace, and a read
	// every guard.CheckInterval) plus a second for a loaded machine; unmanagedBoundAfterStart of an agent
	// restart, whose first read does not count (guard.UnmanagedBoundAfterStart).
	unmanagedBound           = guard.UnmanagedBound + time.Second
	unmanagedBoundAfterStart = guard.UnmanagedBoundAfterStart + time.Second
	// namedLate: a process a client this long was connected at the agent's last read (one every
	// guard.CheckInterval, the read itself up to a slow lookup long), so it is not named unmanaged.
	namedLate = 2*guard.CheckInterval + time.Second
	// sampleEvery is the continuous checks' period.
	sampleEvery = 20 * time.Millisecond
)

// violation is one broken invariant (0: a client hung or the harness failed).
type violation struct {
	seed      uint64
	step, inv int
	what      string
}

func (v violation) String() string {
	return fmt.Sprintf("seed=%d step=%d invariant=%d: %s", v.seed, v.step, v.inv, v.what)
}

type key struct {
	gpu string
	pid int32
}

// checker checks the invariants after each step and every sampleEvery between steps.
type checker struct {
	e *episode
	// agent is the agent's check for unmanaged processes (agentview.go).
	agent *agentView

	mu         sync.Mutex
	step       int
	violations []violation
	// grace periods: since when each thing is allowed to be out of place.
	since       map[key]time.Time // a process's context on a GPU, or its continuing: invariant 1 counts from there
	clientSince map[key]time.Time // a process seen its GPU's scheduler's client at every check since
	missing     map[key]time.Time // not a client since
	ledgerOff   map[string]time.Time
	lastReset   time.Time // a scheduler restart or a lookup fault's end: every bound of invariant 1 restarts
	inRestart   bool
	restartAt   time.Time // the scheduler's last start: invariants 3 and 4 count from its rebuild window's end
	idleSince   map[string]time.Time
	waitSince   map[key]time.Time
	stoppedPID  map[int32]bool
	contAt      map[int32]time.Time
	droppedAt   map[int32]time.Time

	stop chan struct{}
	done chan struct{}
}

func newChecker(e *episode) *checker {
	return &checker{e: e, since: map[key]time.Time{}, clientSince: map[key]time.Time{}, missing: map[key]time.Time{}, ledgerOff: map[string]time.Time{},
		idleSince: map[string]time.Time{}, waitSince: map[key]time.Time{}, lastReset: time.Now(), restartAt: time.Now(), stoppedPID: map[int32]bool{},
		contAt: map[int32]time.Time{}, droppedAt: map[int32]time.Time{}}
}

func (c *checker) setStep(s int) { c.mu.Lock(); c.step = s; c.mu.Unlock() }

func (c *checker) violate(inv int, what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violateLocked(inv, what)
}

func (c *checker) violateLocked(inv int, what string) {
	v := violation{seed: c.e.seed, step: c.step, inv: inv, what: what}
	c.violations = append(c.violations, v)
	fmt.Fprintln(os.Stderr, "SOAK VIOLATION", v)
}

func (c *checker) failed() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.violations) > 0 }

func (c *checker) ctx(pr *proc, d int) {
	c.mu.Lock()
	c.since[key{c.e.uuids[d], pr.pid}] = time.Now()
	c.mu.Unlock()
}

// continued: pr's stall ended; invariant 1's bounds for it count from now.
func (c *checker) continued(pr *proc) {
	c.mu.Lock()
	delete(c.stoppedPID, pr.pid)
	c.contAt[pr.pid] = time.Now()
	c.mu.Unlock()
}

func (c *checker) stopped(pr *proc) { c.mu.Lock(); c.stoppedPID[pr.pid] = true; c.mu.Unlock() }

func (c *checker) drop(pr *proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.droppedAt[pr.pid] = time.Now()
}

func (c *checker) gone(pr *proc) {
	c.mu.Lock()
	delete(c.stoppedPID, pr.pid)
	delete(c.contAt, pr.pid)
	delete(c.droppedAt, pr.pid)
	for k := range c.since {
		if k.pid == pr.pid {
			delete(c.since, k)
			delete(c.missing, k)
			delete(c.clientSince, k)
		}
	}
	c.mu.Unlock()
}

// reset restarts invariant 1's bounds: the pod lookups answer again.
func (c *checker) reset() { c.mu.Lock(); c.lastReset = time.Now(); c.mu.Unlock() }

func (c *checker) restarting() { c.mu.Lock(); c.inRestart = true; c.mu.Unlock() }
func (c *checker) restarted() {
	c.mu.Lock()
	c.inRestart, c.lastReset, c.restartAt = false, time.Now(), time.Now()
	clear(c.idleSince)
	clear(c.waitSince)
	c.mu.Unlock()
}

// held reads the stub driver's per-process holdings of the live processes (an ended process's file is
// removed when it is reaped): bytes by GPU uuid and pod name, and per GPU the pods that hold some of it
// through a process that dropped the shim (outside the ledgers).
func (c *checker) held() (map[string]map[string]int64, map[string]map[string]bool) {
	out, unledgered := map[string]map[string]int64{}, map[string]map[string]bool{}
	for _, pr := range c.e.live() {
		f, err := os.Open(holdFile(c.e.hold, pr.pid))
		if err != nil {
			continue // it holds nothing yet
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var d int
			var b int64
			if _, err := fmt.Sscanf(sc.Text(), "%d %d", &d, &b); err != nil || d >= len(c.e.uuids) {
				continue
			}
			u := c.e.uuids[d]
			if out[u] == nil {
				out[u], unledgered[u] = map[string]int64{}, map[string]bool{}
			}
			out[u][pr.pod.name] += b
			if pr.dropped && b > 0 {
				unledgered[u][pr.pod.name] = true
			}
		}
		_ = f.Close()
	}
	return out, unledgered
}

// checkNow checks invariants 1, 2 and 5 after a step.
func (c *checker) checkNow() {
	c.checkClients()
	c.checkMemory()
}

// checkClients is invariant 1: every process with a context is a client of its GPU and in its pod's
// ledger, within connectBound.
func (c *checker) checkClients() {
	s := c.e.s.get()
	if s == nil {
		return
	}
	now := time.Now()
	clients := map[key]bool{}
	for _, cl := range s.Snapshot() {
		clients[key{cl.GPU, cl.PID}] = true
	}
	ledgers := map[string]int{}
	for _, l := range s.Ledgers() {
		ledgers[l.GPU+" "+l.Key] = l.Processes
	}
	c.e.l.mu.Lock()
	failing := c.e.l.step < c.e.l.failTill
	c.e.l.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if failing { // a lookup fault: the bounds count from its end (reset)
		c.lastReset = now
	}
	want := map[string]int{}
	for _, pr := range c.e.live() {
		if c.stoppedPID[pr.pid] {
			continue
		}
		if pr.dropped {
			c.checkUnmanagedLocked(pr, now)
			continue
		}
		for d := range pr.ctx {
			k := key{c.e.uuids[d], pr.pid}
			from := c.since[k]
			for _, t := range []time.Time{c.lastReset, c.contAt[pr.pid]} {
				if t.After(from) {
					from = t
				}
			}
			if !clients[k] {
				delete(c.clientSince, k)
				if now.Sub(from) > connectBound {
					c.violateLocked(1, fmt.Sprintf("pod %s pid %d has a context on %s and has not been the scheduler's client for %s",
						pr.pod.name, pr.pid, k.gpu, now.Sub(from).Round(time.Millisecond)))
				}
				continue
			}
			c.checkNotNamedLocked(pr, k, from, now)
			if cl, ok := app.LedgerOf(claimsOn(c.e.claims, k.gpu), namespace, pr.pod.name); ok && now.Sub(from) > connectBound {
				want[k.gpu+" "+cl.Key]++
			}
		}
	}
	for lk, n := range want {
		if ledgers[lk] < n {
			if t, ok := c.ledgerOff[lk]; !ok {
				c.ledgerOff[lk] = now
			} else if now.Sub(t) > connectBound {
				c.violateLocked(1, fmt.Sprintf("ledger %s counts %d processes, %d of its pods' clients are connected", lk, ledgers[lk], n))
			}
		} else {
			delete(c.ledgerOff, lk)
		}
	}
}

// checkNotNamedLocked: the process pr, a client on k.gpu since its context (or the last restart, lookup
// fault or stall's end: from), is not named unmanaged once the agent's last read is sure to have seen it
// connected. Named, it would be evicted under the Evict setting while under its lock and ledger.
func (c *checker) checkNotNamedLocked(pr *proc, k key, from, now time.Time) {
	if t, ok := c.clientSince[k]; !ok || from.After(t) {
		c.clientSince[k] = now
	}
	if now.Sub(c.clientSince[k]) > namedLate && c.agent.isNamed(k.gpu, k.pid) {
		c.violateLocked(1, fmt.Sprintf("pod %s pid %d is the scheduler's client on %s (for %s) and the agent names it unmanaged",
			pr.pod.name, pr.pid, k.gpu, now.Sub(c.clientSince[k]).Round(time.Millisecond)))
		c.clientSince[k] = now // once per read, not at every check
	}
}

// checkUnmanagedLocked is invariant 1's other half: a process that dropped the shim and holds a context
// is named unmanaged on that GPU by the agent's check by its due time (unmanagedDueLocked).
func (c *checker) checkUnmanagedLocked(pr *proc, now time.Time) {
	due := c.unmanagedDueLocked(pr)
	for d := range pr.ctx {
		k := key{c.e.uuids[d], pr.pid}
		if c.agent.isNamed(k.gpu, k.pid) {
			continue
		}
		if now.After(due) {
			c.violateLocked(1, fmt.Sprintf("pod %s pid %d dropped the shim and holds a context on %s; not named unmanaged %s after its drop, %s past its bound",
				pr.pod.name, pr.pid, k.gpu, now.Sub(c.droppedAt[pr.pid]).Round(time.Millisecond), now.Sub(due).Round(time.Millisecond)))
		}
	}
}

// unmanagedDueLocked is when pr, a process that dropped the shim, must be named by: unmanagedBound from
// its drop or from the end of a lookup fault after it, and unmanagedBoundAfterStart from an agent
// restart after it (the restarted check's first read does not count).
func (c *checker) unmanagedDueLocked(pr *proc) time.Time {
	dropped := c.droppedAt[pr.pid]
	due := dropped.Add(unmanagedBound)
	if t := c.lastReset.Add(unmanagedBound); c.lastReset.After(dropped) && t.After(due) {
		due = t
	}
	if t := c.restartAt.Add(unmanagedBoundAfterStart); !c.restartAt.Before(dropped) && t.After(due) {
		due = t
	}
	return due
}

// awaitUnmanaged holds the episode's end until every live process that dropped the shim is named
// unmanaged, or its bound has passed (and checkClients reported it): most of them would otherwise be
// killed before the agent's check is due.
func (c *checker) awaitUnmanaged() {
	deadline := time.Now().Add(unmanagedBoundAfterStart + time.Second)
	for {
		c.checkClients()
		if !c.unmanagedDue() || time.Now().After(deadline) {
			return
		}
		time.Sleep(sampleEvery) // polls the state it checks, bounded by unmanagedBound
	}
}

// unmanagedDue: a live process that dropped the shim is not named yet and still within its bound.
func (c *checker) unmanagedDue() bool {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pr := range c.e.live() {
		if !pr.dropped || c.stoppedPID[pr.pid] {
			continue
		}
		due := c.unmanagedDueLocked(pr)
		for d := range pr.ctx {
			if !c.agent.isNamed(c.e.uuids[d], pr.pid) && !now.After(due) {
				return true
			}
		}
	}
	return false
}

// checkMemory is invariants 2 and 5, per GPU: every ledger group over its claims is one the guard
// reports over, and holds memory outside the shim (a process that dropped it); the guard would evict no
// pod within its own claims.
func (c *checker) checkMemory() {
	held, unledgered := c.held()
	for _, u := range c.e.uuids {
		used := held[u]
		claims := claimsOn(c.e.claims, u)
		verdicts := judge(c.e.claims, u, used, unledgered[u])
		reported := map[string]bool{}
		for _, v := range verdicts {
			for _, p := range v.Pods {
				reported[p] = true
			}
			for _, p := range v.Culprits {
				// A pod whose process dropped the shim holds memory outside the ledgers: the guard alone
				// judges it, and may blame it for its group's excess although it is within its own claims.
				name := strings.TrimPrefix(p, namespace+"/")
				if own := c.e.own(u, name); used[name] <= own && !unledgered[u][name] {
					c.violate(5, fmt.Sprintf("the guard would evict %s on %s, which holds %d of its claims' %d (group %v holds %d of %d)",
						p, u, used[name], own, v.Pods, v.Used, v.Claimed))
				}
			}
		}
		for _, g := range groups(claims) {
			var use, claimed int64
			dropped := false
			for _, name := range g.pods {
				use += used[name]
				dropped = dropped || c.e.podNamed(name).dropped
			}
			claimed = g.claimed
			if use <= claimed {
				continue
			}
			switch {
			case !slices.ContainsFunc(g.pods, func(n string) bool { return reported[namespace+"/"+n] }):
				c.violate(2, fmt.Sprintf("group %v on %s holds %d of its claims' %d and the guard does not report it", g.pods, u, use, claimed))
			case !dropped:
				c.violate(2, fmt.Sprintf("group %v on %s holds %d of its claims' %d, every process under the shim", g.pods, u, use, claimed))
			default:
				continue
			}
			fmt.Fprintln(os.Stderr, "SOAK STATE", c.ledgerState(u))
		}
	}
}

func (e *episode) podNamed(name string) *pod {
	for _, p := range e.pods {
		if p.name == name {
			return p
		}
	}
	return &pod{}
}

// sample is invariants 3 and 4, from the scheduler's state.
func (c *checker) sample() {
	s := c.e.s.get()
	c.mu.Lock()
	skip := c.inRestart || s == nil || time.Since(c.restartAt) < rebuildWindow+time.Second
	c.mu.Unlock()
	if skip {
		return
	}
	now := time.Now()
	snap := s.Snapshot()
	c.mu.Lock()
	defer c.mu.Unlock()
	// A stopped holder does not count as holding: the scheduler revokes it within its stall bound
	// while someone waits (scheduler.DefaultStallBound), which idleBound covers.
	stopped := c.stoppedPID
	holders, waiters := map[string]int{}, map[string]int{}
	waiting := map[key]bool{}
	for _, cl := range snap {
		if cl.Holding && !stopped[cl.PID] {
			holders[cl.GPU]++
		}
		if cl.Waiting && !stopped[cl.PID] {
			waiters[cl.GPU]++
		}
		if cl.Waiting && cl.Class == scheduler.ClassProduction {
			k := key{cl.GPU, int32(cl.ID)}
			waiting[k] = true
			if t, ok := c.waitSince[k]; !ok {
				c.waitSince[k] = now
			} else if now.Sub(t) > productionBound {
				c.violateLocked(4, fmt.Sprintf("production client %d (pid %d) has waited %s on %s", cl.ID, cl.PID, now.Sub(t).Round(time.Millisecond), cl.GPU))
				delete(c.waitSince, k)
			}
		}
	}
	for k := range c.waitSince {
		if !waiting[k] {
			delete(c.waitSince, k)
		}
	}
	for _, u := range c.e.uuids {
		if holders[u] > 0 || waiters[u] == 0 {
			delete(c.idleSince, u)
			continue
		}
		if t, ok := c.idleSince[u]; !ok {
			c.idleSince[u] = now
		} else if now.Sub(t) > idleBound {
			c.violateLocked(3, fmt.Sprintf("%s has granted nobody but stopped processes for %s while %d clients wait", u, now.Sub(t).Round(time.Millisecond), waiters[u]))
			delete(c.idleSince, u)
		}
	}
}

func (c *checker) startSampling() {
	c.stop, c.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(c.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				c.sample()
			}
		}
	}()
}

func (c *checker) stopSampling() { close(c.stop); <-c.done }

// settle is invariant 6: with every client gone, every ledger, reservation and account comes back to
// zero within settleBound.
func (c *checker) settle() {
	deadline := time.Now().Add(settleBound)
	for {
		left := c.leftovers()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.violate(6, "every client gone, still: "+strings.Join(left, "; "))
			return
		}
		time.Sleep(sampleEvery) // polls the state it checks, bounded by the deadline
	}
}

func (c *checker) leftovers() []string {
	s := c.e.s.get()
	var left []string
	for _, cl := range s.Snapshot() {
		left = append(left, fmt.Sprintf("client %d pid %d on %s", cl.ID, cl.PID, cl.GPU))
	}
	for _, l := range s.Ledgers() {
		if l.Processes != 0 || l.Granted != 0 {
			left = append(left, fmt.Sprintf("ledger %s on %s: %d processes, %d granted", l.Key, l.GPU, l.Processes, l.Granted))
		}
	}
	for _, g := range s.GPUs() {
		if g.ReservedBytes != 0 || g.Holders != 0 || g.Waiters != 0 {
			left = append(left, fmt.Sprintf("%s: %d reserved, %d holders, %d waiters", g.GPU, g.ReservedBytes, g.Holders, g.Waiters))
		}
	}
	if ents, _ := os.ReadDir(c.e.hold); len(ents) > 0 {
		for _, f := range ents {
			if !strings.HasPrefix(f.Name(), ".") {
				left = append(left, "driver holdings of pid "+f.Name())
			}
		}
	}
	return left
}

// group is a ledger group of one GPU: pods linked by the claims they share there.
type group struct {
	pods    []string
	claimed int64
}

// groups computes the GPU's groups from its claims alone (union of claims that share a pod).
func groups(claims []dra.SizedClaim) []group {
	var out []group
	used := make([]bool, len(claims))
	for i := range claims {
		if used[i] {
			continue
		}
		pods := map[string]bool{}
		for _, p := range claims[i].Pods {
			pods[p] = true
		}
		used[i] = true
		g := group{claimed: claims[i].MemoryBytes}
		for grew := true; grew; {
			grew = false
			for j, cj := range claims {
				if used[j] || !slices.ContainsFunc(cj.Pods, func(p string) bool { return pods[p] }) {
					continue
				}
				used[j], grew = true, true
				g.claimed += cj.MemoryBytes
				for _, p := range cj.Pods {
					pods[p] = true
				}
			}
		}
		for p := range pods {
			g.pods = append(g.pods, p)
		}
		slices.Sort(g.pods)
		out = append(out, g)
	}
	return out
}

// ledgerState is what the scheduler decides by on GPU u, printed beside a violation of invariant 2 so
// that one found in a long run explains itself: each ledger (its processes and charges), each connected
// client, and each live process's holdings there.
func (c *checker) ledgerState(u string) string {
	var b strings.Builder
	if s := c.e.s.get(); s != nil {
		for _, l := range s.Ledgers() {
			if l.GPU == u {
				fmt.Fprintf(&b, "ledger %s: claim %d, %d processes, contexts %d, granted %d, refusals %d; ",
					l.Key, l.Claim, l.Processes, l.Contexts, l.Granted, l.Refusals)
			}
		}
		var pids []int32
		for _, cl := range s.Clients(u) {
			pids = append(pids, cl.PID)
		}
		fmt.Fprintf(&b, "clients %v; ", pids)
	} else {
		b.WriteString("scheduler stopped; ")
	}
	d := slices.Index(c.e.uuids, u)
	for _, pr := range c.e.live() {
		if v := readHold(holdFile(c.e.hold, pr.pid))[d]; v > 0 {
			fmt.Fprintf(&b, "%s pid %d holds %d (dropped %v, stopped %v); ", pr.pod.name, pr.pid, v, pr.dropped, pr.isStopped())
		}
	}
	return b.String()
}
