package scheduler

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// gangEnv serves GPUs "GPU-0".."GPU-<n-1>" on a fake clock, as the agent does (one Scheduler per GPU
// sharing a Gangs) or as the standalone scheduler does (one Scheduler for all). Every client of these
// tests runs in the test's process, so a client's gang is named from its hello: pid/100 for pids below
// 1000 (100 and 101 are gang "1"), none for the others.
type gangEnv struct {
	t      *testing.T
	clock  *fakeClock
	m      *Metrics
	socks  []string
	scheds []*Scheduler
}

const (
	gangQuantum = 100 * time.Millisecond
	gangGrace   = 50 * time.Millisecond
)

func startGangEnv(t *testing.T, n int, perGPU bool) *gangEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "gs") // short: a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &gangEnv{t: t, clock: newFakeClock()}
	if e.m, err = newMetrics(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	var cfgs []GPUConfig
	for i := range n {
		sock := filepath.Join(dir, fmt.Sprintf("%d.sock", i))
		e.socks = append(e.socks, sock)
		cfgs = append(cfgs, GPUConfig{UUID: fmt.Sprintf("GPU-%d", i), SocketPath: sock, Quantum: gangQuantum, Grace: gangGrace})
	}
	groups := [][]GPUConfig{cfgs}
	if perGPU {
		groups = nil
		for _, c := range cfgs {
			groups = append(groups, []GPUConfig{c})
		}
	}
	co := NewGangs()
	for _, g := range groups {
		s, err := New(Options{GPUs: g, Metrics: e.m, Clock: e.clock, Gangs: co})
		if err != nil {
			t.Fatal(err)
		}
		s.gangKeyOf = func(_ int32, h Message) string {
			if h.PID >= 1000 {
				return ""
			}
			return fmt.Sprint(h.PID / 100)
		}
		if err := s.Listen(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.scheds = append(e.scheds, s)
		t.Cleanup(func() {
			for _, q := range s.queues {
				q.mu.Lock()
				if len(q.violations) > 0 {
					t.Errorf("GPU %s: the queue saw %d broken invariants: %v", q.uuid, len(q.violations), q.violations)
				}
				q.mu.Unlock()
			}
		})
		t.Cleanup(s.Close)
	}
	return e
}

// dial connects a client of GPU gpu whose hello gives pid and class.
func (e *gangEnv) dial(gpu int, pid uint32, prio Class) *rawClient {
	e.t.Helper()
	return dialHello(e.t, e.socks[gpu], Message{Type: MsgHello, PID: pid, Priority: prio, GPUUUID: fmt.Sprintf("GPU-%d", gpu)})
}

// state is r's client as its GPU's scheduler sees it.
func (e *gangEnv) state(gpu int, r *rawClient) ClientState {
	for _, s := range e.scheds {
		for _, c := range s.Snapshot() {
			if c.GPU == fmt.Sprintf("GPU-%d", gpu) && c.ID == r.welcome.ClientID {
				return c
			}
		}
	}
	return ClientState{}
}

// waits waits until r asks for GPU gpu and is not granted.
func (e *gangEnv) waits(gpu int, r *rawClient) {
	e.t.Helper()
	wait.Until(e.t, 2*time.Second, func() bool { return e.state(gpu, r).Waiting }, "client %d waits on GPU %d", r.welcome.ClientID, gpu)
}

// none fails if r receives a message of type typ within a short while.
func none(t *testing.T, r *rawClient, typ MsgType, why string) {
	t.Helper()
	if m, ok := r.next(typ, 100*time.Millisecond); ok {
		t.Fatalf("%s: got %v %+v", why, typ, m)
	}
}

func TestGangGrantedAndRevokedTogether(t *testing.T) {
	e := startGangEnv(t, 2, false)
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	s1 := e.dial(1, 2000, ClassOpportunistic)

	x0.hold() // the gang's turn: both GPUs reserved for it
	s1.send(Message{Type: MsgAcquire})
	e.waits(1, s1)
	none(t, s1, MsgGrant, "a single client was granted a GPU reserved for a gang")
	x1.hold() // its peer, granted at once although s1 asked first
	if g := e.state(0, x0).Gang; g != "1" {
		t.Errorf("snapshot gang of x0 = %q, want 1", g)
	}

	// s1 waits for one of the gang's GPUs: both members are told, and revoked together.
	x0.expect(MsgContended, time.Second)
	x1.expect(MsgContended, time.Second)
	e.clock.Advance(gangQuantum + gangGrace)
	x0.expect(MsgRevoked, time.Second)
	x1.expect(MsgRevoked, time.Second)
	s1.expect(MsgGrant, time.Second)
	if n := prom.CounterValue(t, e.m.gangTurns.WithLabelValues("1", gangEndQuantum)); n != 1 {
		t.Errorf("gang turns ended by the quantum = %v, want 1", n)
	}
}

// collectiveStep is one member's side of a collective: ask for its GPU, and once granted, keep it until
// its peer holds its own (in), then release. It reports what went wrong, without the testing.T (it
// runs on its own goroutine).
func collectiveStep(r *rawClient, step int, in chan<- int, peer <-chan int) error {
	b, _ := Encode(Message{Type: MsgAcquire})
	if _, err := r.conn.Write(b); err != nil {
		return err
	}
	g, ok := r.next(MsgGrant, 3*time.Second)
	if !ok {
		return fmt.Errorf("client %d not granted at step %d", r.welcome.ClientID, step)
	}
	in <- step
	select {
	case <-peer:
	case <-time.After(3 * time.Second):
		return fmt.Errorf("client %d holds at step %d, its peer never joined", r.welcome.ClientID, step)
	}
	b, _ = Encode(Message{Type: MsgRelease, Epoch: g.Epoch})
	_, err := r.conn.Write(b)
	return err
}

// TestCrossingGangsBothFinish runs two two-GPU gangs that cross (X asks GPU 0 first, Y GPU 1), each
// member holding its GPU until its peer holds the other, as a collective's kernels do. The clock never
// moves: a member spinning for its peer would wait for a revocation that never comes.
func TestCrossingGangsBothFinish(t *testing.T) {
	e := startGangEnv(t, 2, true) // as the agent runs them: one Scheduler per GPU
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	y1, y0 := e.dial(1, 200, ClassOpportunistic), e.dial(0, 201, ClassOpportunistic)
	const steps = 5
	errs := make(chan error, 4)
	member := func(r *rawClient, in chan<- int, peer <-chan int) {
		for i := range steps {
			if err := collectiveStep(r, i, in, peer); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}
	xa, xb, ya, yb := make(chan int, steps), make(chan int, steps), make(chan int, steps), make(chan int, steps)
	go member(x0, xa, xb)
	wait.Until(t, 2*time.Second, func() bool { return e.state(0, x0).Grants > 0 }, "x0 granted")
	go member(y1, ya, yb)
	wait.Until(t, 2*time.Second, func() bool { s := e.state(1, y1); return s.Waiting || s.Holding }, "y1 asks")
	go member(x1, xb, xa)
	go member(y0, yb, ya)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []string{"1", "2"} {
		if n := prom.CounterValue(t, e.m.gangTurns.WithLabelValues(g, gangEndQuantum)); n != 0 {
			t.Errorf("gang %s revoked %v times at its quantum", g, n)
		}
	}
}

func TestGangMemberKilledFreesTheOthers(t *testing.T) {
	e := startGangEnv(t, 2, false)
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	s0 := e.dial(0, 2000, ClassOpportunistic)
	x0.hold()
	x1.hold()
	s0.send(Message{Type: MsgAcquire})
	e.waits(0, s0)
	x1.conn.Close() // killed: x0's collective cannot finish
	x0.expect(MsgRevoked, time.Second)
	s0.expect(MsgGrant, time.Second)
	if n := prom.GaugeValue(t, e.m.gangs); n != 0 {
		t.Errorf("gangs = %v after a member left, want 0", n)
	}
}

func TestProductionGangPreemptsOnAllItsGPUs(t *testing.T) {
	e := startGangEnv(t, 2, false)
	o0, o1 := e.dial(0, 3000, ClassOpportunistic), e.dial(1, 3001, ClassOpportunistic)
	p0, p1 := e.dial(0, 500, ClassProduction), e.dial(1, 501, ClassProduction)
	o0.hold()
	o1.hold()
	p0.hold() // one member asks: the gang takes both GPUs at once
	o0.expect(MsgRevoked, time.Second)
	o1.expect(MsgRevoked, time.Second)
	p1.hold()
}

func TestOpportunisticGangYieldsToProductionOnAnyGPU(t *testing.T) {
	e := startGangEnv(t, 2, false)
	x0, x1 := e.dial(0, 100, ClassOpportunistic), e.dial(1, 101, ClassOpportunistic)
	h1 := e.dial(1, 4000, ClassProduction)
	epoch := h1.hold()
	x0.send(Message{Type: MsgAcquire})
	e.waits(0, x0)
	none(t, x0, MsgGrant, "an opportunistic gang's member was granted while production holds its other GPU")
	h1.send(Message{Type: MsgRelease, Epoch: epoch})
	x0.expect(MsgGrant, time.Second)
	x1.hold()

	// Production asks for one of the gang's GPUs: the gang's turn ends there at once, and on the other
	// GPU after the grace (gangpreempt.go).
	h1.send(Message{Type: MsgAcquire})
	x1.expect(MsgRevoked, time.Second)
	h1.expect(MsgGrant, time.Second)
	e.clock.Advance(gangGrace)
	x0.expect(MsgRevoked, time.Second)
	if n := prom.CounterValue(t, e.m.gangTurns.WithLabelValues("1", gangEndPreempted)); n != 1 {
		t.Errorf("gang turns preempted = %v, want 1", n)
	}
}

func TestSessionOfReadsTheStatLine(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A command name with a space and a parenthesis: fields are counted after the last ')'.
	stat := "42 (py (rank) 0) S 1 40 41 0 -1 4194560 0 0\n"
	if err := os.WriteFile(filepath.Join(dir, "42", "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if sid, ok := sessionOf(dir, 42); !ok || sid != 41 {
		t.Errorf("sessionOf = %d, %v; want 41, true", sid, ok)
	}
	if _, ok := sessionOf(dir, 43); ok {
		t.Error("sessionOf found a session for a pid with no stat")
	}
	// Session 0: the leader is outside the reader's PID namespace, so the process has no session to name.
	if err := os.MkdirAll(filepath.Join(dir, "44"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "44", "stat"), []byte("44 (py) S 1 0 0 0 -1 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if sid, ok := sessionOf(dir, 44); ok {
		t.Errorf("sessionOf(session 0) = %d, true; want none", sid)
	}
	// A real process that leads its own session: the stat line of the live /proc names it.
	// (The test process itself may belong to a session whose leader is outside this PID
	// namespace, where the kernel reports session 0.)
	child := exec.Command("sleep", "60")
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	if sid, ok := sessionOf("/proc", int32(child.Process.Pid)); !ok || sid != int32(child.Process.Pid) {
		t.Errorf("sessionOf(session leader %d) = %d, %v", child.Process.Pid, sid, ok)
	}
}

// Clients of one owner on one GPU are no gang: they reserve nothing beyond their own GPU.
func TestOneGPUOwnerIsNoGang(t *testing.T) {
	e := startGangEnv(t, 2, false)
	a, b := e.dial(0, 100, ClassOpportunistic), e.dial(0, 101, ClassOpportunistic)
	s1 := e.dial(1, 2000, ClassOpportunistic)
	a.hold()
	s1.hold() // GPU 1 is free: nothing reserves it
	b.send(Message{Type: MsgAcquire})
	e.waits(0, b) // behind a, as on any GPU
	if g := e.state(0, a).Gang; g != "" {
		t.Errorf("snapshot gang of a one-GPU owner = %q, want none", g)
	}
	if n := prom.GaugeValue(t, e.m.gangs); n != 0 {
		t.Errorf("gangs = %v, want 0", n)
	}
}
