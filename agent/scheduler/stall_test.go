package scheduler

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/procfs"
	"github.com/gpusharing/gpusharing/test/freezer"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// stoppedPIDs is a fake process table for the stall check: the pids stopped now.
type stoppedPIDs struct {
	mu   sync.Mutex
	pids map[int32]bool
	read int // reads so far
	// told are the revocations Guards.OnStallRevoked heard of.
	told []StallRevocation
}

func (s *stoppedPIDs) tell(r StallRevocation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.told = append(s.told, r)
}

func (s *stoppedPIDs) revocations() []StallRevocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]StallRevocation(nil), s.told...)
}

func (s *stoppedPIDs) set(pid int32, stopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pids[pid] = stopped
}

func (s *stoppedPIDs) stopped(pid int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.read++
	return s.pids[pid]
}

func (s *stoppedPIDs) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.read
}

// watchStalls turns the stall check on for fx's queue, over a fake process table, with the default bound.
func (fx *queueFixture) watchStalls() *stoppedPIDs {
	s := &stoppedPIDs{pids: map[int32]bool{}}
	fx.q.mu.Lock()
	fx.q.stallBound, fx.q.stopped, fx.q.onStall = DefaultStallBound, s.stopped, s.tell
	fx.q.mu.Unlock()
	return s
}

// A production holder never yields to an opportunistic waiter (TestOpportunisticWaitsForProductionToRelease),
// but one whose process is stopped does: its lock is revoked within the stall bound and two reads, the
// waiter runs, and the stall is counted. Running again, production asks and preempts at once.
func TestAStoppedProductionHolderLosesTheLockToAWaiter(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	procs := fx.watchStalls()
	p, o := fx.joinAs(t, pod(2000)), fx.joinAs(t, pod(10))
	p.c.pid, o.c.pid = 7, 8
	fx.q.acquire(p.c, 0)
	epoch := grantEpoch(t, p)
	fx.q.acquire(o.c, 0)

	procs.set(7, true)
	fx.clock.Advance(DefaultStallBound) // first seen stopped at the first read, 100 ms in
	if fx.holder() != p.c || p.count(MsgRevoked) != 0 {
		t.Fatalf("revoked before its process had been seen stopped for %s", DefaultStallBound)
	}
	fx.clock.Advance(2 * stallCheckEvery)
	if r, ok := p.last(MsgRevoked); !ok || r.Epoch != epoch {
		t.Fatalf("the stopped production holder got %+v (%v), want REVOKED of epoch %d", r, ok, epoch)
	}
	if fx.holder() != o.c {
		t.Fatal("the opportunistic waiter did not run once the stopped holder was revoked")
	}
	if got := prom.CounterValue(t, fx.m.stalls.WithLabelValues("GPU-test")); got != 1 {
		t.Errorf("stall_revocations_total = %v, want 1", got)
	}
	if s := fx.q.snapshot(); s[0].Revocations != 1 {
		t.Errorf("the stopped client's revocations = %d, want 1", s[0].Revocations)
	}
	// Seen stopped at the reads at 100 ms and 600 ms after the stop, granted since the start.
	want := StallRevocation{GPU: "GPU-test", PID: 7, Class: ClassProduction, Stopped: DefaultStallBound, Held: DefaultStallBound + stallCheckEvery}
	if got := procs.revocations(); len(got) != 1 || got[0] != want {
		t.Errorf("OnStallRevoked heard %+v, want %+v", got, want)
	}

	procs.set(7, false) // it runs again: its shim reads REVOKED and asks at its next call
	fx.q.release(p.c, epoch, 0)
	fx.q.acquire(p.c, 0)
	if fx.holder() != p.c || o.count(MsgRevoked) != 1 {
		t.Fatal("production back from its stop did not preempt the opportunistic holder")
	}
}

// What is left alone: a holder stopped while nobody waits (nothing is read then), and one stopped for
// less than the bound while someone waits, which keeps the lock for good once it runs again.
func TestAStopShorterThanTheBoundOrWithNobodyWaitingKeepsTheLock(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	procs := fx.watchStalls()
	p, o := fx.joinAs(t, pod(2000)), fx.joinAs(t, pod(10))
	p.c.pid, o.c.pid = 7, 8
	fx.q.acquire(p.c, 0)
	procs.set(7, true)
	fx.clock.Advance(10 * time.Second)
	if p.count(MsgRevoked) != 0 || procs.reads() != 0 {
		t.Fatalf("with nobody waiting: %d revocations, %d reads of the process table; want none", p.count(MsgRevoked), procs.reads())
	}

	fx.q.acquire(o.c, 0)
	fx.clock.Advance(DefaultStallBound - stallCheckEvery) // seen stopped at 100 ms, the bound not reached
	procs.set(7, false)
	fx.clock.Advance(time.Minute)
	if p.count(MsgRevoked) != 0 || fx.holder() != p.c {
		t.Fatal("a production holder stopped for less than the bound lost the lock")
	}
	if got := prom.CounterValue(t, fx.m.stalls.WithLabelValues("GPU-test")); got != 0 {
		t.Errorf("stall_revocations_total = %v, want 0", got)
	}
	// A second stop starts its own count: the first one's time does not carry over.
	procs.set(7, true)
	fx.clock.Advance(stallCheckEvery + DefaultStallBound/2)
	if p.count(MsgRevoked) != 0 {
		t.Fatal("a second short stop was revoked on the first one's time")
	}
	fx.clock.Advance(DefaultStallBound)
	if p.count(MsgRevoked) != 1 || fx.holder() != o.c {
		t.Fatal("the second stop, past the bound, did not hand the GPU to the waiter")
	}
}

// Among opportunistic clients the quantum would end a stopped holder's hold too, but only at quantum +
// grace: the stall check hands the GPU over within its bound instead.
func TestAStoppedHolderGoesBeforeItsQuantumEnds(t *testing.T) {
	fx := newQueueFixture(t, time.Minute, 30*time.Second)
	procs := fx.watchStalls()
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	a.c.pid, b.c.pid = 7, 8
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	procs.set(7, true)
	fx.clock.Advance(DefaultStallBound + 2*stallCheckEvery)
	if a.count(MsgRevoked) != 1 || fx.holder() != b.c {
		t.Fatalf("a stopped holder with a minute of quantum left: revoked %d times, the waiter holds %v", a.count(MsgRevoked), fx.holder() == b.c)
	}
}

// The real shim and the real process table: a production shim client that holds the lock (its own idle
// window ten minutes) is stopped with SIGSTOP. An opportunistic client that then asks is granted once
// the stall bound has passed, where it would otherwise wait for as long as the stop lasts; continued,
// the production client asks again and preempts it.
func TestAStoppedShimProcessHandsTheGPUOver(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	prod := e.startClient(stalledProduction, "dlsym", "1000000", "1000")
	awaitProductionHolds(t, e, prod, func(int) bool { return true })
	if err := prod.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.cmd.Process.Signal(syscall.SIGCONT) })
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		stopped, err := procfs.Stopped("/proc", prod.pid())
		return stopped, fmt.Sprintf("stopped %v, %v", stopped, err)
	}, "the production client's threads stopped")
	expectHandOverAndBack(t, e, prod, func() error { return prod.cmd.Process.Signal(syscall.SIGCONT) })
}

// The same with the production client's container paused: its cgroup frozen by the kernel's freezer
// (cgroup v1 and v2), which leaves its threads asleep rather than stopped.
func TestAFrozenShimProcessHandsTheGPUOver(t *testing.T) {
	for _, v := range freezer.Versions {
		t.Run(v, func(t *testing.T) {
			cg := freezer.New(t, v)
			e := newEnv(t, time.Minute, time.Minute)
			prod := e.startWrapped(cg.Wrap, "client", stalledProduction, "dlsym", "1000000", "1000")
			awaitProductionHolds(t, e, prod, cg.Mounted)
			cg.FreezeAndWait(t)
			t.Cleanup(func() { _ = cg.Thaw() }) // before the client is killed: a v1-frozen process dies only once thawed
			expectHandOverAndBack(t, e, prod, cg.Thaw)
		})
	}
}

// stalledProduction: a production client whose own idle window (ten minutes) keeps the lock.
var stalledProduction = []string{"GPUSHARE_PRIORITY=high", "GPUSHARE_IDLE_MS=600000"}

// awaitProductionHolds waits until prod holds the lock as a production client and ready(pid) holds.
func awaitProductionHolds(t *testing.T, e *env, prod *proc, ready func(pid int) bool) {
	t.Helper()
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		s, ok := e.state(prod.pid())
		return ok && s.Holding && s.Class == ClassProduction && ready(prod.pid()), fmt.Sprintf("%+v (found %v)", s, ok)
	}, "the production client holds the lock")
}

// expectHandOverAndBack: with prod unable to run, an opportunistic client that asks is granted (one
// stall revocation); after resume, prod asks again and preempts it.
func expectHandOverAndBack(t *testing.T, e *env, prod *proc, resume func() error) {
	t.Helper()
	opp := dialRaw(t, e.sock, ClassOpportunistic)
	asked := time.Now()
	opp.send(Message{Type: MsgAcquire})
	opp.expect(MsgGrant, 5*time.Second)
	t.Logf("the opportunistic client was granted %s after it asked", time.Since(asked).Round(time.Millisecond))
	if got := e.counter("gpusharing_scheduler_stall_revocations_total"); got != 1 {
		t.Errorf("stall_revocations_total = %v, want 1", got)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	opp.expect(MsgRevoked, 5*time.Second)
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		s, ok := e.state(prod.pid())
		return ok && s.Holding, fmt.Sprintf("%+v (found %v)", s, ok)
	}, "the production client, running again, holds the lock")
}

// watchStalls puts every GPU of e on a fake process table. Every client of e runs in the test's process,
// so the table says of all or none that they are stopped; only holders are read.
func (e *gangEnv) watchStalls() *stoppedPIDs {
	procs := &stoppedPIDs{pids: map[int32]bool{}}
	for _, s := range e.scheds {
		for _, q := range s.queues {
			q.mu.Lock()
			q.stopped = procs.stopped
			q.mu.Unlock()
		}
	}
	return procs
}

// A production gang never yields to an opportunistic waiter, but a gang whose member's process is
// stopped loses its turn on all its GPUs at once.
func TestAStoppedGangMemberEndsItsGangsTurn(t *testing.T) {
	e := startGangEnv(t, 2, true)
	procs := e.watchStalls()
	x0, x1 := e.dial(0, 100, ClassProduction), e.dial(1, 101, ClassProduction)
	s1 := e.dial(1, 2000, ClassOpportunistic)
	x0.hold()
	x1.hold()
	s1.send(Message{Type: MsgAcquire})
	e.waits(1, s1)
	e.clock.Advance(time.Minute)
	none(t, s1, MsgGrant, "an opportunistic client was granted a GPU a running production gang holds")

	procs.set(int32(os.Getpid()), true)
	e.clock.Advance(DefaultStallBound + 2*stallCheckEvery)
	x0.expect(MsgRevoked, time.Second)
	x1.expect(MsgRevoked, time.Second)
	s1.expect(MsgGrant, time.Second)
	if n := prom.CounterValue(t, e.m.gangTurns.WithLabelValues("1", gangEndStalled)); n != 1 {
		t.Errorf("gang turns ended by a stall = %v, want 1", n)
	}
}

// A gang waits on a GPU whose holder is stopped from another GPU: its member asks on GPU 1, free, but
// the gang takes its turn on both of its GPUs, and a stopped production client holds GPU 0, where
// nobody else waits. That holder is revoked as if the gang waited on GPU 0 itself.
func TestAGangWaitingElsewhereHasAStoppedHolderRevoked(t *testing.T) {
	e := startGangEnv(t, 2, true)
	procs := e.watchStalls()
	s0 := e.dial(0, 2000, ClassProduction)
	s0.hold()
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	x1.send(Message{Type: MsgAcquire})
	e.waits(1, x1)
	e.clock.Advance(time.Minute)
	none(t, x1, MsgGrant, "the gang ran on GPU 1 while production held its GPU 0")

	procs.set(int32(os.Getpid()), true)
	e.clock.Advance(DefaultStallBound + 2*stallCheckEvery)
	s0.expect(MsgRevoked, time.Second)
	x1.expect(MsgGrant, time.Second)
	if st := e.state(0, x0); st.Waiting {
		t.Errorf("the gang's member on GPU 0 waits, it never asked: %+v", st)
	}
}
