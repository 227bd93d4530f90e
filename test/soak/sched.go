package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/gpusharing/gpusharing/agent/app"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// The scheduler's settings in the soak: short enough that a few minutes see many hand-offs.
const (
	quantum        = 200 * time.Millisecond
	grace          = 100 * time.Millisecond
	rebuildWindow  = 300 * time.Millisecond
	contextReserve = 64 << 20
	// contextFloor is the least a measured context is charged: below the stub's 48 MiB contexts.
	contextFloor = 32 << 20
	evictTimeout = 2 * time.Second
	// productionPriority is the pod priority from which a pod's clients are production.
	productionPriority = 1000
)

// lookups answers the scheduler's questions about a client's pod as the agent's pod lookups would,
// with the faults the soak injects: a delay, or failures until a deadline.
type lookups struct {
	mu     sync.Mutex
	pods   map[int32]*pod
	claims []dra.SizedClaim
	delay  time.Duration
	// step is the soak's; lookups fail while it is below failTill.
	step, failTill int
}

func (l *lookups) set(pid int32, p *pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p == nil {
		delete(l.pods, pid)
		return
	}
	l.pods[pid] = p
}

// find is the pod of pid, after the injected delay; nil when the lookup fails.
func (l *lookups) find(pid int32) *pod {
	l.mu.Lock()
	d, failing, p := l.delay, l.step < l.failTill, l.pods[pid]
	l.mu.Unlock()
	if d > 0 {
		time.Sleep(d) // the lookup itself is slow: the scheduler's caller waits on it as on an API server
	}
	if failing {
		return nil
	}
	return p
}

// findAll is the pods of pids in one lookup (the accounting's), after the injected delay; none while the
// lookups fail.
func (l *lookups) findAll(pids []int32) map[int32]*pod {
	l.mu.Lock()
	d, failing := l.delay, l.step < l.failTill
	out := map[int32]*pod{}
	for _, pid := range pids {
		if p := l.pods[pid]; p != nil {
			out[pid] = p
		}
	}
	l.mu.Unlock()
	if d > 0 {
		time.Sleep(d) // the lookup itself is slow, as find's
	}
	if failing {
		return nil
	}
	return out
}

// claimOf is the agent's claim ledger lookup: through the pod UIDs the claims record and the pod UID of
// the process (its cgroup, which neither the delay nor the failures of the pod lookups touch), and
// through a pod lookup only where a claim has none recorded.
func (l *lookups) claimOf(gpu string, pid int32) (scheduler.Claim, bool) {
	claims := claimsOn(l.claims, gpu)
	l.mu.Lock()
	p := l.pods[pid]
	l.mu.Unlock()
	if p == nil {
		return scheduler.Claim{}, false // a process of no pod
	}
	if cl, ok, found := app.LedgerOfUID(claims, p.uid()); found {
		return cl, ok
	}
	if p = l.find(pid); p == nil {
		return scheduler.Claim{}, false
	}
	return app.LedgerOf(claims, namespace, p.name)
}

func (l *lookups) priority(pid int32) (int32, bool) {
	p := l.find(pid)
	if p == nil {
		return 0, false
	}
	return p.priority, true
}

// key names a pod for gangs and peers, as the agent's pod UID does; a pod it cannot name is the pid.
func (l *lookups) key(pid int32) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pods[pid]; p != nil {
		return p.name
	}
	return fmt.Sprint(pid)
}

// sched is the GPU scheduler of the soak's node, in this process so that it can be stopped and
// started again as an agent restart does.
type sched struct {
	cur    atomic.Pointer[scheduler.Scheduler] // nil while stopped; the checker reads it from its goroutine
	s      *scheduler.Scheduler
	cancel context.CancelFunc
	cfgs   []scheduler.GPUConfig
	opts   scheduler.Options
}

func newSched(dir, hold string, gpus []string, l *lookups) *sched {
	prio := int32(productionPriority)
	var cfgs []scheduler.GPUConfig
	for _, g := range gpus {
		cfgs = append(cfgs, scheduler.GPUConfig{UUID: g, SocketPath: filepath.Join(dir, g+".sock"), Quantum: quantum,
			Grace: grace, ProductionPriority: &prio})
	}
	return &sched{cfgs: cfgs, opts: scheduler.Options{GPUs: cfgs, RebuildWindow: rebuildWindow, Guards: scheduler.Guards{
		ClaimOf: l.claimOf, PodPriority: l.priority, GangKey: l.key, PeerKey: l.key,
		ContextReserve: contextReserve, ContextFloor: contextFloor, EvictTimeout: evictTimeout,
		ProcessMemory: nvmlProcesses(hold, gpus),
	}}}
}

// up starts the scheduler on its sockets.
func (s *sched) up() error {
	sc, err := scheduler.New(s.opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if tracing && !stepsOnly { // the scheduler's log beside the steps
		ctx = logr.NewContext(ctx, funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) },
			funcr.Options{Verbosity: 1, LogTimestamp: true}))
	}
	if err := sc.Listen(ctx); err != nil {
		cancel()
		return err
	}
	s.s, s.cancel = sc, cancel
	s.cur.Store(sc)
	return nil
}

// down stops it: every connection ends, as when the agent is killed.
func (s *sched) down() {
	if s.s == nil {
		return
	}
	s.cur.Store(nil)
	s.cancel()
	s.s.Close()
	s.s = nil
}

// get is the running scheduler, nil while it is stopped.
func (s *sched) get() *scheduler.Scheduler { return s.cur.Load() }

func claimsOn(claims []dra.SizedClaim, gpu string) []dra.SizedClaim {
	var out []dra.SizedClaim
	for _, c := range claims {
		if c.GPU == gpu {
			out = append(out, c)
		}
	}
	return out
}
