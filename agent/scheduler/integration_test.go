package scheduler

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/test/wait"
)

func monoNow(t *testing.T) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// A launch reached through each lookup path must wait while another process
// holds the lock, and run only after it is released.
func TestShimLaunchWaitsForTheLockThroughEveryLookupPath(t *testing.T) {
	for _, mode := range []string{"dlsym", "procaddr", "procaddr_v1", "ptsz"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, time.Minute, time.Minute) // the holder keeps the lock until it releases
			holder := dialRaw(t, e.sock, ClassOpportunistic)
			epoch := holder.hold()
			c := e.startClient(nil, mode, "5")
			// Its first launch asked for the lock (the client's first call that needs it): the shim
			// is inside that launch now, and the stub driver must not have seen it.
			wait.Until(t, 5*time.Second, func() bool {
				s, ok := e.state(c.pid())
				return ok && s.Waiting
			}, "the client waits for the lock")
			if n := e.readTrace().count(c.pid()); n != 0 || c.exited() {
				t.Fatalf("client ran %d launches (exited=%v) while another process held the lock", n, c.exited())
			}
			released := monoNow(t)
			holder.send(Message{Type: MsgRelease, Epoch: epoch})
			c.wait(t, 5*time.Second)
			tr := e.readTrace()
			if n := tr.count(c.pid()); n != 5 {
				t.Fatalf("trace has %d launches of the client, want 5", n)
			}
			for _, w := range tr.work {
				if w.start < released {
					t.Fatalf("launch began %d ns before the lock was released", released-w.start)
				}
			}
		})
	}
}

// Two processes under a short quantum take turns, and the GPU work of one
// never overlaps the other's (the release waits for queued work to finish).
func TestTwoClientsAlternateUnderShortQuantumWithoutOverlap(t *testing.T) {
	e := newEnv(t, 20*time.Millisecond, 5*time.Second)
	a := e.startClient(nil, "dlsym", "300", "1000")
	b := e.startClient(nil, "procaddr", "300", "1000")
	a.wait(t, 20*time.Second)
	b.wait(t, 20*time.Second)
	tr := e.readTrace()
	if tr.count(a.pid()) != 300 || tr.count(b.pid()) != 300 {
		t.Fatalf("trace has %d and %d launches, want 300 each", tr.count(a.pid()), tr.count(b.pid()))
	}
	if o := tr.overlaps(); o != "" {
		t.Fatalf("GPU work overlapped: %s", o)
	}
	if sw := tr.switches(); sw < 4 {
		t.Errorf("the GPU changed hands %d times; with a 20 ms quantum over ~600 ms each, want several", sw)
	}
	if h := e.counter("gpusharing_scheduler_handoffs_total"); h < 4 {
		t.Errorf("handoffs_total = %v, want >= 4", h)
	}
	if r := e.counter("gpusharing_scheduler_revocations_total"); r != 0 {
		t.Errorf("revocations_total = %v; cooperative clients must not be revoked", r)
	}
}

// The lease is the connection: SIGKILL of a holder that never releases hands
// the lock to the waiter within a second.
func TestKilledHolderFreesTheLockForItsWaiterWithinASecond(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	a := e.startClient([]string{"GPUSHARE_IDLE_MS=600000"}, "dlsym", "100000", "1000")
	wait.Until(t, 2*time.Second, func() bool {
		s, ok := e.state(a.pid())
		return ok && s.Holding
	}, "the client holds the lock")
	waiter := dialRaw(t, e.sock, ClassOpportunistic)
	waiter.send(Message{Type: MsgAcquire})
	e.waitQueued(t, 1) // not granted while the holder is alive and busy
	killed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waiter.expect(MsgGrant, time.Second)
	t.Logf("lock handed over %v after SIGKILL", time.Since(killed))
}

// A holder that stops making GPU calls gives the lock up after the idle
// window, while it is still alive and its quantum is far from used. The
// waiter asks as soon as the client has made its last call; either way it
// cannot be granted before the idle window has passed. GPUSHARE_IDLE_US, the
// window the agent gives production on GPUs with classes, wins over
// GPUSHARE_IDLE_MS: with the minutes of the latter the waiter would not be
// granted in time.
func TestIdleHolderReleasesAfterTheIdleWindow(t *testing.T) {
	for _, c := range []struct {
		name   string
		env    []string
		window time.Duration
	}{
		{"GPUSHARE_IDLE_MS", []string{"GPUSHARE_IDLE_MS=50"}, 50 * time.Millisecond},
		{"GPUSHARE_IDLE_US wins", []string{"GPUSHARE_IDLE_MS=600000", "GPUSHARE_IDLE_US=20000"}, 20 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, time.Minute, time.Minute)
			// COPY_US: the final cuMemAlloc/cuMemFree are work calls too, so the trace has the last call.
			a := e.startClient(append(c.env, "GPUSHARE_STUB_COPY_US=1"), "dlsym", "50", "2000", "0", "600000")
			wait.Until(t, 5*time.Second, func() bool {
				return strings.Contains(a.stdout.String(), "client done")
			}, "the client made its last GPU call")
			waiter := dialRaw(t, e.sock, ClassOpportunistic)
			waiter.send(Message{Type: MsgAcquire})
			waiter.expect(MsgGrant, 3*time.Second)
			granted := monoNow(t)
			if a.exited() {
				t.Fatal("the lock came free only because the client exited")
			}
			if s, ok := e.state(a.pid()); !ok || s.Grants == 0 || s.Holding {
				t.Fatalf("client state after the waiter's grant = %+v (found %v); want it alive, granted before, not holding", s, ok)
			}
			last := e.readTrace().lastCall[a.pid()]
			if last == 0 {
				t.Fatal("no GPU call of the client in the trace")
			}
			idle := time.Duration(granted - last)
			t.Logf("lock reached the waiter %v after the holder's last GPU call", idle)
			// The grant came after the release, so idle is at least the real idle time: never under the
			// window. (How much later the idle release comes is the shim's timer under this machine's
			// load: not checked.)
			if idle < c.window {
				t.Errorf("lock free %v after the last GPU call, before the %v idle window passed", idle, c.window)
			}
		})
	}
}

// A production shim client whose own idle window is ten minutes releases the lock soon after its last
// GPU call once an opportunistic client connects: the scheduler tells it ProductionIdle (IDLE), which
// the shim takes over its own longer window. Without IDLE the opportunistic waiter would wait for the
// production process to exit.
func TestProductionReleasesAfterTheSchedulersIdleWindow(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	prod := e.startClient([]string{"GPUSHARE_PRIORITY=high", "GPUSHARE_IDLE_MS=600000", "GPUSHARE_LOG_LEVEL=info"},
		"dlsym", "50", "2000", "0", "600000")
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(prod.stdout.String(), "client done")
	}, "the production client made its last GPU call")
	if s, ok := e.state(prod.pid()); !ok || !s.Holding || s.Class != ClassProduction {
		t.Fatalf("production client state %+v (found %v); want it holding, production", s, ok)
	}
	opp := dialRaw(t, e.sock, ClassOpportunistic)
	opp.send(Message{Type: MsgAcquire})
	opp.expect(MsgGrant, 3*time.Second)
	if prod.exited() {
		t.Fatal("the lock came free only because the production client exited")
	}
	// The shim logs the window before it can release under it, but its stderr reaches the buffer through a
	// pipe and a copying goroutine, which may come after the grant.
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		out := prod.stderr.String()
		return strings.Contains(out, "the GPU scheduler asks for an idle release after 1000 us"), out
	}, "the production client logs the scheduler's window")
}

// Beside a busy opportunistic client the scheduler also tells a production shim client of protocol 7 to
// release once its work completed (SETTLE, right after its WELCOME here): the shim's release says so,
// with its own window ten minutes. The opportunistic holder it preempted is granted again.
func TestProductionReleasesOnceItsWorkCompleted(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	opp := dialRaw(t, e.sock, ClassOpportunistic)
	opp.hold()
	prod := e.startClient([]string{"GPUSHARE_PRIORITY=high", "GPUSHARE_IDLE_MS=600000", "GPUSHARE_LOG_LEVEL=debug"},
		"dlsym", "50", "2000", "0", "600000")
	opp.expect(MsgRevoked, 5*time.Second)
	opp.send(Message{Type: MsgAcquire})
	wait.Until(t, 5*time.Second, func() bool {
		return strings.Contains(prod.stdout.String(), "client done")
	}, "the production client made its last GPU call")
	opp.expect(MsgGrant, 3*time.Second)
	if prod.exited() {
		t.Fatal("the lock came free only because the production client exited")
	}
	want := fmt.Sprintf("asks for a release once this process's GPU work completed and %d us passed",
		DefaultSettleFloor/time.Microsecond)
	wait.UntilState(t, 5*time.Second, func() (bool, string) { // its stderr comes through a pipe (above)
		s := prod.stderr.String()
		return strings.Contains(s, want) && strings.Contains(s, "(work completed)"), s
	}, "the production client releases on completion (%q and a release for \"work completed\")", want)
}

// GPUSHARE_PRIORITY=high reaches the scheduler (which trusts the hello where
// it names no pods): behind a production holder, the production process gets
// the lock before an opportunistic waiter that asked earlier. Beside that
// waiter the scheduler gives the production process a 1 ms idle window (IDLE),
// so between its launches it may hand the GPU over and take it back; what
// holds whatever the machine's load is that the waiter is granted only after
// the production process ran.
func TestHighPriorityShimClientGoesFirstAtHandOff(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	holder := dialRaw(t, e.sock, ClassProduction)
	epoch := holder.hold()
	normal := dialRaw(t, e.sock, ClassOpportunistic)
	normal.send(Message{Type: MsgAcquire})
	wait.Until(t, time.Second, func() bool {
		for _, s := range e.s.Snapshot() {
			if s.Waiting {
				return true
			}
		}
		return false
	}, "the normal waiter queues")
	high := e.startClient([]string{"GPUSHARE_PRIORITY=high"}, "dlsym", "20", "1000")
	wait.Until(t, 2*time.Second, func() bool {
		s, ok := e.state(high.pid())
		return ok && s.Waiting && s.Class == ClassProduction
	}, "the high-priority client queues")
	holder.send(Message{Type: MsgRelease, Epoch: epoch})
	normal.expect(MsgGrant, 5*time.Second)
	granted := monoNow(t)
	high.wait(t, 5*time.Second)
	first := int64(-1)
	for _, w := range e.readTrace().work {
		if w.pid == high.pid() && (first < 0 || w.start < first) {
			first = w.start
		}
	}
	if first < 0 {
		t.Fatal("no GPU work of the high-priority client in the trace")
	}
	if first > granted {
		t.Errorf("the earlier opportunistic waiter was granted before the production process ran (%v before)",
			time.Duration(first-granted))
	}
}

// A holder that ignores CONTENDED is told REVOKED after quantum + grace and the waiter gets the lock.
func TestHolderIgnoringItsQuantumIsRevoked(t *testing.T) {
	e := newEnv(t, 50*time.Millisecond, 50*time.Millisecond)
	stubborn := dialRaw(t, e.sock, ClassOpportunistic)
	// The quantum counts from the grant, which the holder sees only after the scheduler sent it: the
	// bound is measured from before the holder asks.
	start := time.Now()
	epoch := stubborn.hold()
	waiter := dialRaw(t, e.sock, ClassOpportunistic)
	waiter.send(Message{Type: MsgAcquire})
	stubborn.expect(MsgContended, time.Second)
	r := stubborn.expect(MsgRevoked, time.Second)
	if r.Epoch != epoch {
		t.Errorf("revoked epoch %d, want %d", r.Epoch, epoch)
	}
	waiter.expect(MsgGrant, time.Second)
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("revoked after %v, before quantum + grace (100 ms)", d)
	}
	if v := e.counter("gpusharing_scheduler_revocations_total"); v != 1 {
		t.Errorf("revocations_total = %v, want 1", v)
	}
}

// A shim holder that cannot release because a stream is capturing is never
// synchronized during the capture; it is revoked, keeps running, and its next
// GPU call waits for the lock again.
func TestShimHolderStuckInCaptureIsRevokedNotSynchronized(t *testing.T) {
	e := newEnv(t, 30*time.Millisecond, 50*time.Millisecond)
	a := e.startClient([]string{"GPUSHARE_IDLE_MS=10"}, "dlsym", "3", "0", "1500")
	wait.Until(t, 2*time.Second, func() bool {
		s, ok := e.state(a.pid())
		return ok && s.Holding
	}, "the capturing client holds the lock")
	waiter := dialRaw(t, e.sock, ClassOpportunistic)
	waiter.send(Message{Type: MsgAcquire})
	epoch := waiter.expect(MsgGrant, time.Second).Epoch
	if v := e.counter("gpusharing_scheduler_revocations_total"); v != 1 {
		t.Fatalf("revocations_total = %v, want 1", v)
	}
	// Its capture ends 1.5 s after it began; the bound leaves a loaded machine's slack beyond that (a
	// machine running the suite beside a soak took more than 2 s).
	wait.Until(t, 10*time.Second, func() bool {
		s, ok := e.state(a.pid())
		return ok && s.Waiting
	}, "the revoked client asks for the lock again")
	waiter.send(Message{Type: MsgRelease, Epoch: epoch})
	a.wait(t, 5*time.Second)
	if !strings.Contains(a.stderr.String(), "revoked") {
		t.Errorf("the client did not log its revocation:\n%s", a.stderr.String())
	}
	if n := e.readTrace().syncInCapt; n != 0 {
		t.Errorf("the shim synchronized %d times while a stream was capturing", n)
	}
}

// Killing the scheduler leaves its clients running, without the lock while they
// reconnect, with one warning.
func TestClientsContinueInPassThroughWhenTheSchedulerDies(t *testing.T) {
	e := newEnv(t, time.Second, time.Second)
	a := e.startClient(nil, "procaddr", "500", "1000")
	wait.Until(t, 2*time.Second, func() bool {
		s, ok := e.state(a.pid())
		return ok && s.Holding
	}, "the client holds the lock")
	e.s.Close()
	closed := monoNow(t)
	a.wait(t, 10*time.Second)
	after := 0
	for _, w := range e.readTrace().work {
		if w.pid == a.pid() && w.start > closed {
			after++
		}
	}
	if after == 0 {
		t.Fatal("no GPU work after the scheduler went away")
	}
	if n := strings.Count(a.stderr.String(), "GPU scheduler went away"); n != 1 {
		t.Errorf("got %d warnings that the scheduler went away, want exactly 1:\n%s", n, a.stderr.String())
	}
}

// A peer that is not a scheduler (garbage, or silence) never hangs the application: it runs without
// the lock, warned once, while the shim keeps trying in the background.
func TestShimRunsWithoutTheLockWhenThePeerIsNotAScheduler(t *testing.T) {
	for _, tc := range []struct {
		name  string
		greet []byte
	}{
		{"garbage reply", []byte("HTTP/1.1 400 Bad Request\r\n\r\n")},
		{"silent peer", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, time.Second, time.Second)
			e.s.Close()
			ln, err := net.Listen("unix", e.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					if tc.greet != nil {
						_, _ = c.Write(tc.greet)
					}
					defer c.Close()
				}
			}()
			start := time.Now()
			a := e.startClient([]string{"GPUSHARE_CONNECT_TIMEOUT_MS=300"}, "dlsym", "5")
			a.wait(t, 5*time.Second)
			if n := strings.Count(a.stderr.String(), "cannot reach the GPU scheduler"); n != 1 {
				t.Errorf("got %d warnings that the scheduler cannot be reached, want 1:\n%s", n, a.stderr.String())
			}
			if strings.Contains(a.stderr.String(), "GPU lock disabled") {
				t.Errorf("a failed first connect turned the lock off for good:\n%s", a.stderr.String())
			}
			t.Logf("completed in %v", time.Since(start))
		})
	}
}

// Peers that break the protocol are dropped, a holder among them loses the
// lock at once, and well-behaved clients keep being served.
func TestMalformedPeersAreDroppedWhileOthersAreServed(t *testing.T) {
	e := newEnv(t, time.Minute, time.Minute)
	good := dialRaw(t, e.sock, ClassOpportunistic)

	// 1. Garbage instead of a hello: the scheduler hangs up.
	junk, err := net.Dial("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	_, _ = junk.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = junk.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := junk.Read(make([]byte, 64)); err == nil {
		t.Fatalf("scheduler answered %d bytes to garbage instead of closing", n)
	}

	// 2. A holder that sends a corrupt message loses the lock to the waiter.
	bad := dialRaw(t, e.sock, ClassOpportunistic)
	bad.hold()
	good.send(Message{Type: MsgAcquire})
	e.waitQueued(t, 1) // not granted while the other client holds the lock
	corrupt, _ := Encode(Message{Type: MsgRelease, Epoch: 1})
	corrupt[0] ^= 0xff
	if _, err := bad.conn.Write(corrupt); err != nil {
		t.Fatal(err)
	}
	epoch := good.expect(MsgGrant, time.Second).Epoch

	// 3. A client may not send scheduler-to-client messages.
	impostor := dialRaw(t, e.sock, ClassProduction)
	impostor.send(Message{Type: MsgGrant, Epoch: 99})
	wait.Until(t, 5*time.Second, func() bool { return len(e.s.Snapshot()) == 1 }, "the impostor is dropped")
	// Everything the scheduler sent it until the hang-up, up to the EOF that ends the wait.
	if _, ok := impostor.next(MsgWelcome, time.Minute); ok {
		t.Fatal("unexpected second welcome")
	}

	// The good client is still served.
	good.send(Message{Type: MsgRelease, Epoch: epoch})
	good.hold()
	if s := e.s.Snapshot(); len(s) != 1 || !s[0].Holding {
		t.Fatalf("snapshot after the bad peers = %+v", s)
	}
}

// A peer that connects and never says hello is dropped after HelloTimeout.
func TestSilentPeerIsDroppedAfterHelloTimeout(t *testing.T) {
	dir := t.TempDir()
	sock := dir + "/s.sock"
	if len(sock) > 100 {
		dir, _ = os.MkdirTemp("", "gs")
		defer os.RemoveAll(dir)
		sock = dir + "/s.sock"
	}
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-x", SocketPath: sock}}, HelloTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || time.Since(start) > time.Second {
		t.Fatalf("silent peer not dropped by the hello timeout (err %v after %v)", err, time.Since(start))
	}
}
