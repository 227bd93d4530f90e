package scheduler

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Faults around restarts, with real processes: the scheduler is the
// standalone cmd/gpushare-scheduler, SIGKILLed and started again on the same
// socket; its clients are the shim's test programs on the stub driver.

var (
	schedBinOnce sync.Once
	schedBin     string
	schedBinErr  error
)

// schedulerBinary builds cmd/gpushare-scheduler once per test run.
func schedulerBinary(t *testing.T) string {
	t.Helper()
	build := shimBuild(t) // skips in -short
	schedBinOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		schedBin = filepath.Join(build, "gpushare-scheduler") // where the GPU checks expect it too
		cmd := exec.Command("go", "build", "-o", schedBin, "./cmd/gpushare-scheduler")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			schedBinErr = fmt.Errorf("go build ./cmd/gpushare-scheduler: %v\n%s", err, out)
		}
	})
	if schedBinErr != nil {
		t.Fatal(schedBinErr)
	}
	return schedBin
}

// procEnv is an env whose scheduler runs as its own process.
func procEnv(t *testing.T) *env {
	t.Helper()
	build := shimBuild(t)
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &env{t: t, build: build, dir: dir, sock: filepath.Join(dir, "GPU-test.sock"), trace: filepath.Join(dir, "trace")}
}

type schedProc struct {
	cmd  *exec.Cmd
	out  lockedBuffer
	done chan struct{}
}

// startScheduler runs the scheduler binary for GPU-test (gpu is the --gpu value after "GPU-test:")
// and waits until it accepts connections.
func (e *env) startScheduler(gpu string, window time.Duration) *schedProc {
	e.t.Helper()
	p := &schedProc{done: make(chan struct{})}
	p.cmd = exec.Command(schedulerBinary(e.t), "--socket-dir", e.dir, "--gpu", "GPU-test:"+gpu,
		"--rebuild-window", window.String(), "-v", "1")
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a test binary killed by -timeout
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	e.t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	wait.Until(e.t, 10*time.Second, func() bool {
		return strings.Contains(p.out.String(), "Serving GPU lock")
	}, "the scheduler serves its socket")
	return p
}

// kill SIGKILLs the scheduler: no cleanup of any kind, its socket file stays.
func (p *schedProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// stop ends the scheduler with SIGTERM and returns what it printed (its clients' states and counters).
func (p *schedProc) stop(t *testing.T) string {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the scheduler did not stop on SIGTERM")
	}
	return p.out.String()
}

var reconnectLine = regexp.MustCompile(`reconnected to the GPU scheduler after [0-9.]+ s; re-announced \d+ bytes resident, \d+ swapped out`)

// logReconnects records how long each client took to reconnect and what it re-announced.
func logReconnects(t *testing.T, ps ...*proc) {
	t.Helper()
	for _, p := range ps {
		t.Logf("client %d: %s", p.pid(), reconnectLine.FindString(p.stderr.String()))
	}
}

// The scheduler is SIGKILLed while one client holds the lock and another
// waits. Both keep running (without the lock) until a new scheduler is up on
// the same socket; then they reconnect, re-announce, and the lock works
// again: no two processes' GPU work overlaps from then on, and the new
// scheduler granted both.
func TestSchedulerKilledWhileHoldingIsRejoinedAndTheLockWorksAgain(t *testing.T) {
	e := procEnv(t)
	stop := filepath.Join(e.dir, "stop")
	s1 := e.startScheduler("50ms:5s", 300*time.Millisecond)
	// The clients launch until the test has seen them work under the new scheduler (CLIENT_UNTIL_FILE):
	// neither may finish during the outage or the rebuild window.
	until := []string{"CLIENT_UNTIL_FILE=" + stop}
	a := e.startClient(until, "procaddr", "3000", "1000")
	b := e.startClient(until, "procaddr", "3000", "1000")
	wait.Until(t, 10*time.Second, func() bool {
		tr := e.readTrace()
		return tr.count(a.pid()) > 20 && tr.count(b.pid()) > 20
	}, "both clients ran under the first scheduler")
	s1.kill(t)
	killed := monoNow(t)
	// The outage: both clients noticed it and went on without the lock.
	wait.Until(t, 10*time.Second, func() bool {
		tr := e.readTrace()
		return strings.Contains(a.stderr.String(), "running without the GPU lock") &&
			strings.Contains(b.stderr.String(), "running without the GPU lock") &&
			tr.lastCall[a.pid()] > killed && tr.lastCall[b.pid()] > killed
	}, "both clients ran GPU work without the lock while the scheduler was down")
	s2 := e.startScheduler("50ms:5s", 300*time.Millisecond)
	wait.Until(t, 10*time.Second, func() bool {
		return strings.Contains(a.stderr.String(), "reconnected to the GPU scheduler") &&
			strings.Contains(b.stderr.String(), "reconnected to the GPU scheduler")
	}, "both clients reconnected")
	rejoined := monoNow(t)
	logReconnects(t, a, b)
	// Work under the new scheduler: its rebuild window passed and each client was granted since.
	wait.Until(t, 30*time.Second, func() bool {
		var after trace
		for _, w := range e.readTrace().work {
			if w.start > rejoined {
				after.work = append(after.work, w)
			}
		}
		return after.count(a.pid()) > 20 && after.count(b.pid()) > 20
	}, "both clients ran under the new scheduler")
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.wait(t, 60*time.Second)
	b.wait(t, 60*time.Second)
	out := s2.stop(t)

	var after trace
	for _, w := range e.readTrace().work {
		if w.start > rejoined {
			after.work = append(after.work, w)
		}
	}
	if o := after.overlaps(); o != "" {
		t.Errorf("GPU work overlapped after the clients rejoined (at %d): %s", rejoined, o)
		for _, w := range after.work {
			if w.end-w.start > 50_000_000 {
				t.Logf("long interval: %+v", w)
			}
		}
		t.Logf("a:\n%s\nb:\n%s", a.stderr.String(), b.stderr.String())
	}
	if m := regexp.MustCompile(`gpusharing_scheduler_handoffs_total\{gpu="GPU-test"\} (\d+)`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Errorf("the new scheduler handed the lock from one client to the other no time:\n%s", out)
	}
	if !strings.Contains(out, "Shim client re-announced itself") {
		t.Errorf("the new scheduler logged no re-announcement:\n%s", out)
	}
	for _, p := range []*proc{a, b} {
		if n := strings.Count(p.stderr.String(), "GPU scheduler went away"); n != 1 {
			t.Errorf("client %d: %d warnings that the scheduler went away, want 1:\n%s", p.pid(), n, p.stderr.String())
		}
	}
}

// Oversubscription: the scheduler is SIGKILLed while the two clients swap
// (together they hold 1.5x the budget, so one of them has memory swapped out)
// and the device is full meanwhile, so nothing can be mapped back without a
// scheduler. The process with memory swapped out never runs on unmapped memory
// (its GPU calls wait, it is not killed), both reconnect to the restarted
// scheduler, which rebuilds its account from their reports before granting,
// and both finish with every byte right; physical memory never exceeded the
// budget. The clients work until the test has seen them reconnect (until_file),
// so neither can finish during the outage.
func TestSchedulerKilledWithMemorySwappedOutLosesNothing(t *testing.T) {
	const budget = 16 * mib // each client 12 MiB: together 1.5x the budget
	e := procEnv(t)
	full, stop := filepath.Join(e.dir, "full"), filepath.Join(e.dir, "stop")
	gpu := fmt.Sprintf("5ms:200ms:%d:Auto", budget)
	s1 := e.startScheduler(gpu, 500*time.Millisecond)
	env := []string{"GPUSHARE_STUB_FULL_FILE=" + full, "GPUSHARE_RESTORE_WAIT_MS=60000"}
	args := []string{"bufs=5", "size=2097152", "small=8", "iters=3000", "sleep_us=100", "verify_every=100", "until_file=" + stop}
	a := e.startOversub(env, append(args, "seed=1")...)
	b := e.startOversub(env, append(args, "seed=2")...)
	// Once both allocated everything (the device is made full below: a new allocation would fail) and swapped.
	wait.Until(t, 20*time.Second, func() bool {
		return strings.Contains(a.stdout.String(), "oversub allocated") && strings.Contains(b.stdout.String(), "oversub allocated") &&
			strings.Count(a.stderr.String(), "swap out:") >= 2 && strings.Count(b.stderr.String(), "swap out:") >= 2
	}, "both clients allocated and swapped under the first scheduler")
	if err := os.WriteFile(full, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s1.kill(t)
	killed := monoNow(t)
	// Each client's background thread reads the EOF at once and logs which way it goes on: its GPU calls
	// wait (memory swapped out) or it runs without the lock.
	const gone = "GPU scheduler went away"
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(a.stderr.String(), gone) && strings.Contains(b.stderr.String(), gone),
			fmt.Sprintf("a noticed=%v b noticed=%v", strings.Contains(a.stderr.String(), gone), strings.Contains(b.stderr.String(), gone))
	}, "both clients noticed that the scheduler went away")
	var swapped []*proc
	for _, p := range []*proc{a, b} {
		if strings.Contains(p.stderr.String(), "swapped out: GPU calls wait") {
			swapped = append(swapped, p)
			continue
		}
		// A client with nothing swapped out goes on without the lock: the outage is lived through once
		// it queued GPU work after the kill.
		wait.Until(t, 10*time.Second, func() bool { return e.readTrace().lastCall[p.pid()] > killed },
			"client %d, with nothing swapped out, ran GPU work while the scheduler was down", p.pid())
	}
	if len(swapped) == 0 {
		t.Fatalf("no client had memory swapped out when the scheduler died:\n%s\n%s", a.stderr.String(), b.stderr.String())
	}
	for _, p := range []*proc{a, b} {
		if p.exited() {
			t.Fatalf("client %d died while the scheduler was down (%v):\nstdout:\n%s\nstderr:\n%s", p.pid(), p.err,
				p.stdout.String(), p.stderr.String())
		}
	}
	s2 := e.startScheduler(gpu, 500*time.Millisecond)
	if err := os.Remove(full); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 30*time.Second, func() bool {
		return strings.Contains(a.stderr.String(), "reconnected to the GPU scheduler") &&
			strings.Contains(b.stderr.String(), "reconnected to the GPU scheduler")
	}, "both clients reconnected to the new scheduler")
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	va := a.waitOversub(t, 120*time.Second)
	vb := b.waitOversub(t, 120*time.Second)
	out := s2.stop(t)
	t.Logf("verified %d and %d ranges; swaps a out=%d in=%d, b out=%d in=%d", va["verified"], vb["verified"],
		va["swap_out"], va["swap_in"], vb["swap_out"], vb["swap_in"])
	logReconnects(t, a, b)
	if n := strings.Count(out, "Shim client re-announced itself"); n < 2 {
		t.Errorf("the new scheduler logged %d re-announcements, want 2:\n%s", n, out)
	}
	if peak := e.peakPhysical(); peak > budget {
		t.Errorf("physical memory of both processes peaked at %d bytes, budget %d", peak, budget)
	}
	m := regexp.MustCompile(`peak_reserved=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no account in the scheduler's output:\n%s", out)
	}
	if peak, _ := strconv.ParseUint(m[1], 10, 64); peak == 0 || peak > budget {
		t.Errorf("the rebuilt account peaked at %d bytes, want within (0, %d]", peak, budget)
	}
}

// A restarted scheduler grants nothing during its rebuild window, so the
// memory of a client that re-announces late in the window is accounted before
// anything is handed out: the early waiter is granted only after the late
// client was evicted for it.
func TestRestartedSchedulerHoldsGrantsUntilClientsReannounce(t *testing.T) {
	const budget = 64 * mib
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpu.sock")
	// What a killed scheduler leaves: its socket file, nobody listening.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = ln.Close()

	// The window ends when the test advances the clock, after both clients' messages were handled.
	clk := newFakeClock()
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock, Quantum: time.Second, Budget: budget}},
		RebuildWindow: 600 * time.Millisecond, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	early := dialRaw(t, sock, ClassOpportunistic)
	early.send(Message{Type: MsgRejoin})
	early.send(Message{Type: MsgAcquire, Need: budget})
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		st := s.Snapshot()
		return len(st) == 1 && st[0].Waiting, fmt.Sprintf("%+v", st)
	}, "the early client's acquire is handled: it waits")
	clk.Advance(200 * time.Millisecond)
	late := dialRaw(t, sock, ClassOpportunistic)
	late.send(Message{Type: MsgRejoin, Flags: RejoinHeld, Need: budget / 2, Resident: budget / 2})
	wait.Until(t, 5*time.Second, func() bool { return s.GPUs()[0].ReservedBytes == budget/2 },
		"the late client's memory is accounted")
	for _, c := range s.Snapshot() {
		if c.Grants != 0 || c.Holding {
			t.Fatalf("granted during the rebuild window, before the late client's memory was accounted: %+v", s.Snapshot())
		}
	}
	clk.Advance(400 * time.Millisecond) // the window ends
	ev := late.expect(MsgEvict, 2*time.Second)
	if ev.Target != 0 {
		t.Errorf("evict target %d, want 0", ev.Target)
	}
	// Granted what is free while the eviction runs (it swaps in meanwhile), the rest once it is done.
	g := early.expect(MsgGrant, 2*time.Second)
	if g.Resident != budget/2 {
		t.Errorf("grant reservation %d, want the free %d", g.Resident, budget/2)
	}
	// The grant is sent with the account that goes with it: the holder may have only the free half until
	// the eviction is done (a raise would have grown its reservation to the whole budget).
	holders := 0
	for _, c := range s.Snapshot() {
		if c.Holding {
			holders++
			if c.ReservedBytes != budget/2 {
				t.Fatalf("the holder's reservation is %d before the eviction freed anything, want %d: %+v", c.ReservedBytes, budget/2, s.Snapshot())
			}
		}
	}
	if holders != 1 {
		t.Fatalf("%d holders after the grant, want 1: %+v", holders, s.Snapshot())
	}
	late.send(Message{Type: MsgUsage, Reason: UsageEvicted, Stats: SwapStats{Swapped: budget / 2}})
	if r := early.expect(MsgRaise, 2*time.Second); r.Resident != budget {
		t.Errorf("raised to %d, want %d", r.Resident, budget)
	}
	if st := s.GPUs()[0]; st.ReservedBytes > budget || st.PeakReservedBytes > budget {
		t.Errorf("account %+v exceeds the budget", st)
	}
}

// A Rejoin is only accepted as a connection's first message after Hello.
func TestRejoinAfterOtherMessagesDropsTheClient(t *testing.T) {
	e := newMemEnv(t, time.Second, time.Second, 64*mib, ModeAuto)
	r := dialRaw(t, e.sock, ClassOpportunistic)
	r.send(Message{Type: MsgAcquire, Need: mib})
	r.expect(MsgGrant, time.Second)
	r.send(Message{Type: MsgRejoin, Resident: 32 * mib})
	wait.Until(t, 2*time.Second, func() bool { return len(e.s.Snapshot()) == 0 }, "the client is dropped")
	if got := e.s.GPUs()[0].ReservedBytes; got != 0 {
		t.Errorf("reserved %d after the client was dropped", got)
	}
}

// The shim's wait for a MEMREPLY is bounded: against a scheduler that grants
// but never answers a memory request, the allocation goes on after
// GPUSHARE_MEMREPLY_TIMEOUT_MS with a log line, the connection is given up
// and the shim reconnects and re-announces; the program finishes with its
// data right.
func TestShimMemReplyWaitIsBounded(t *testing.T) {
	build := shimBuild(t)
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, build: build, dir: dir, sock: filepath.Join(dir, "gpu.sock"), trace: filepath.Join(dir, "trace")}
	ln, err := net.Listen("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var rejoins, memreqs atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				hello, err := ReadMessage(c)
				if err != nil || hello.Type != MsgHello {
					return
				}
				// Answered in the shim's own version, as the scheduler does.
				w, _ := Encode(Message{Type: MsgWelcome, Version: hello.Version, ClientID: 1, QuantumMS: 60000, GraceMS: 1000, Budget: 256 * mib})
				_, _ = c.Write(w)
				if hello.Version == 0 || hello.Version >= 6 {
					// a Ledger (none) follows the Welcome, then a Policy: the test's short MEMREPLY timeout
					// is an override to allow
					l, _ := Encode(Message{Type: MsgLedger, Version: hello.Version})
					_, _ = c.Write(l)
					p, _ := Encode(Message{Type: MsgPolicy, Version: hello.Version, Flags: PolicyEnvOverrides})
					_, _ = c.Write(p)
				}
				for epoch := uint32(1); ; {
					m, err := ReadMessage(c)
					if err != nil {
						return
					}
					switch m.Type {
					case MsgAcquire:
						g, _ := Encode(Message{Type: MsgGrant, Version: hello.Version, Epoch: epoch, QuantumMS: 60000, Resident: m.Need})
						epoch++
						_, _ = c.Write(g)
					case MsgMemReq:
						memreqs.Add(1) // never answered
					case MsgRejoin:
						rejoins.Add(1)
					}
				}
			}()
		}
	}()
	p := e.startOversub([]string{"GPUSHARE_MEMREPLY_TIMEOUT_MS=300"}, "bufs=3", "size=4194304", "small=0", "iters=200")
	p.waitOversub(t, 30*time.Second)
	if !strings.Contains(p.stderr.String(), "no answer to a memory request") {
		t.Errorf("no log line about the missing MEMREPLY:\n%s", p.stderr.String())
	}
	if memreqs.Load() == 0 || rejoins.Load() == 0 {
		t.Errorf("memreqs=%d rejoins=%d: want the shim to have asked, given up and re-announced", memreqs.Load(), rejoins.Load())
	}
}

// fork() in a shim process: the child is a client of its own (its own
// connection and lease, taken at its first GPU call); the parent's connection
// and lease are untouched. Parent and child never run GPU work at the same
// time, both finish, and neither sees its scheduler connection fail.
func TestForkedChildIsItsOwnClientAndLeavesTheParentsConnection(t *testing.T) {
	e := newEnv(t, 20*time.Millisecond, 5*time.Second) // a grace no loaded machine outlasts: no revocation
	a := e.startClient([]string{"CLIENT_FORK_AT=100", "CLIENT_FORK_LAUNCHES=200"}, "procaddr", "600", "500")
	var parentID uint32
	wait.Until(t, 5*time.Second, func() bool {
		s, ok := e.state(a.pid())
		parentID = s.ID
		return ok
	}, "the parent is a client")
	a.wait(t, 30*time.Second)
	m := regexp.MustCompile(`forked child pid=(\d+)`).FindStringSubmatch(a.stdout.String())
	if m == nil || !strings.Contains(a.stdout.String(), "child done") || !strings.Contains(a.stdout.String(), "child status=0") {
		t.Fatalf("the child did not finish:\n%s\n%s", a.stdout.String(), a.stderr.String())
	}
	child, _ := strconv.Atoi(m[1])
	tr := e.readTrace()
	if o := tr.overlaps(); o != "" {
		t.Errorf("parent and child ran GPU work at the same time: %s", o)
	}
	if tr.count(child) != 200 || tr.count(a.pid()) != 600 {
		t.Errorf("launches: child %d (want 200), parent %d (want 600)", tr.count(child), tr.count(a.pid()))
	}
	if st, ok := e.state(a.pid()); ok && st.ID != parentID {
		t.Errorf("the parent's client id changed from %d to %d: its connection was replaced", parentID, st.ID)
	}
	for _, bad := range []string{"went away", "protocol error", "GPU lock disabled", "cannot reach"} {
		if strings.Contains(a.stderr.String(), bad) {
			t.Errorf("a connection failed (%q):\n%s", bad, a.stderr.String())
		}
	}
	if e.counter("gpusharing_scheduler_handoffs_total") == 0 {
		t.Error("no hand-off between parent and child: the child did not wait for the lock")
	}
}

// A client that dials again the moment its connection ends, as a shim does, finds no scheduler listening
// once Close dropped it: never a connection accepted and then closed at its HELLO, which a shim would
// take for an older scheduler refusing its protocol version (soak seed 30169). Where Close dropped the
// clients first, some redial of each round's 16 reached the listener in most rounds.
func TestClosedSchedulerTakesInNoClientThatRedialsAtOnce(t *testing.T) {
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpu.sock")
	hello, err := Encode(Message{Type: MsgHello, PID: uint32(os.Getpid()), Priority: ClassOpportunistic, GPUUUID: "GPU-test"})
	if err != nil {
		t.Fatal(err)
	}
	const clients = DefaultMaxConnsPerPeer / 2 // all from this process: room for as many redials
	for round := range 10 {
		s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock, Quantum: time.Minute, Grace: time.Minute}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Listen(context.Background()); err != nil {
			t.Fatal(err)
		}
		outcomes := make(chan string, clients)
		for range clients {
			c := dialRaw(t, sock, ClassOpportunistic)
			go func() {
				for range c.in { // until the connection ends
				}
				conn, err := net.Dial("unix", sock)
				if err != nil {
					outcomes <- "" // nobody listens: the shim reconnects with backoff, in its own protocol
					return
				}
				defer conn.Close()
				_, _ = conn.Write(hello)
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := ReadMessage(conn); err != nil {
					outcomes <- fmt.Sprintf("accepted, then closed at its HELLO (%v)", err)
					return
				}
				outcomes <- "answered by a scheduler that was closed"
			}()
		}
		wait.Until(t, 5*time.Second, func() bool { return len(s.Snapshot()) == clients }, "every client connected")
		s.Close()
		for range clients {
			if o := <-outcomes; o != "" {
				t.Fatalf("round %d: a client that redialed when Close dropped it was %s", round, o)
			}
		}
	}
}
