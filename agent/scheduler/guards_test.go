package scheduler

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// startGuarded serves GPU "GPU-test" with the given config and guards on a fresh socket, with no C
// programs: the peers of these tests are raw protocol clients.
func startGuarded(t *testing.T, cfg GPUConfig, g Guards) (*Scheduler, string, *Metrics) {
	t.Helper()
	return startGuardedAt(t, cfg, g, nil)
}

// startGuardedAt is startGuarded on clock clk (nil: the real one).
func startGuardedAt(t *testing.T, cfg GPUConfig, g Guards, clk Clock) (*Scheduler, string, *Metrics) {
	t.Helper()
	dir, err := os.MkdirTemp("", "gs") // short: a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.UUID, cfg.SocketPath = "GPU-test", filepath.Join(dir, "gpu.sock")
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{GPUs: []GPUConfig{cfg}, Metrics: m, Guards: g, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, cfg.SocketPath, m
}

// closedWithin reports whether the peer closes conn within d without sending anything more than skip
// messages' worth of bytes (a refused connection gets no Welcome).
func closedWithin(conn net.Conn, d time.Duration) (closed bool, got int) {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	n, err := io.Copy(io.Discard, conn)
	return err == nil, int(n) // io.Copy returns nil at EOF
}

// A holder that starts a message and stops mid-way is dropped at the frame deadline, so its waiter
// gets the GPU long before any quantum. Without the deadline the read blocked for good and the
// waiter waited for quantum + grace (here 20s) at best.
func TestPeerStallingMidMessageIsDroppedAndItsWaiterRuns(t *testing.T) {
	_, sock, m := startGuarded(t, GPUConfig{Quantum: 10 * time.Second, Grace: 10 * time.Second},
		Guards{FrameTimeout: 200 * time.Millisecond})
	a := dialRaw(t, sock, ClassOpportunistic)
	a.hold()
	b := dialRaw(t, sock, ClassOpportunistic)
	b.send(Message{Type: MsgAcquire})
	frame, _ := Encode(Message{Type: MsgRelease, Epoch: 1})
	if _, err := a.conn.Write(frame[:5]); err != nil { // half a header, then silence
		t.Fatal(err)
	}
	b.expect(MsgGrant, 3*time.Second)
	if v := prom.CounterValue(t, m.dropped.WithLabelValues("GPU-test", DropFrameTimeout)); v != 1 {
		t.Fatalf("frame-timeout drops = %v", v)
	}
}

// A quiet client (no message started) is never dropped by the frame deadline: its lease is its
// connection, however long it idles.
func TestIdleClientOutlivesTheFrameDeadline(t *testing.T) {
	_, sock, m := startGuarded(t, GPUConfig{Quantum: time.Minute}, Guards{FrameTimeout: 50 * time.Millisecond})
	a := dialRaw(t, sock, ClassOpportunistic)
	epoch := a.hold()
	// A second peer stops mid-message after a's last message: once it is dropped for that, the frame
	// deadline of every message a sent has passed too.
	b := dialRaw(t, sock, ClassOpportunistic)
	frame, _ := Encode(Message{Type: MsgAcquire})
	if _, err := b.conn.Write(frame[:5]); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, func() bool {
		return prom.CounterValue(t, m.dropped.WithLabelValues("GPU-test", DropFrameTimeout)) == 1
	}, "the peer that stopped mid-message is dropped at the frame deadline")
	a.send(Message{Type: MsgRelease, Epoch: epoch})
	a.hold() // still served: granted again
}

// Connections beyond the per-peer cap, then beyond the socket's cap, are closed before any Welcome
// and counted; a slot given back is usable again.
func TestConnectionsPerPeerAndPerSocketAreCapped(t *testing.T) {
	t.Run("per peer", func(t *testing.T) {
		_, sock, m := startGuarded(t, GPUConfig{}, Guards{MaxConns: 10, MaxConnsPerPeer: 2})
		dialRaw(t, sock, ClassOpportunistic)
		second := dialRaw(t, sock, ClassOpportunistic)
		third, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer third.Close()
		if closed, n := closedWithin(third, 2*time.Second); !closed || n != 0 {
			t.Fatalf("third connection of one peer: closed=%v after %d bytes", closed, n)
		}
		if v := prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefusePeerLimit)); v != 1 {
			t.Fatalf("peer-limit refusals = %v", v)
		}
		second.conn.Close()
		wait.Until(t, 2*time.Second, func() bool {
			c, err := net.Dial("unix", sock)
			if err != nil {
				return false
			}
			defer c.Close()
			b, _ := Encode(Message{Type: MsgHello, PID: 1, GPUUUID: "GPU-test"})
			_, _ = c.Write(b)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			w, err := ReadMessage(c)
			return err == nil && w.Type == MsgWelcome
		}, "a freed slot is usable again")
	})
	t.Run("per socket", func(t *testing.T) {
		// Every connection of this test comes from one process: a PeerKey naming each connection's
		// own slot makes only the socket's cap apply.
		n := 0
		_, sock, m := startGuarded(t, GPUConfig{}, Guards{MaxConns: 2, PeerKey: func(int32) string { n++; return string(rune('a' + n)) }})
		dialRaw(t, sock, ClassOpportunistic)
		dialRaw(t, sock, ClassOpportunistic)
		third, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer third.Close()
		if closed, n := closedWithin(third, 2*time.Second); !closed || n != 0 {
			t.Fatalf("third connection of the socket: closed=%v after %d bytes", closed, n)
		}
		if v := prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseSocketLimit)); v != 1 {
			t.Fatalf("socket-limit refusals = %v", v)
		}
	})
}

// Where the agent names pods, a client's class comes from its pod's priority against the GPU's
// production threshold, whatever its hello asks: a process cannot make itself production, and a
// production pod's process is production even if its environment asks for less.
func TestClassComesFromThePeersPodNotItsHello(t *testing.T) {
	threshold := int32(1000)
	for _, tc := range []struct {
		name      string
		asked     Class
		pod       int32
		known     bool
		threshold *int32
		want      Class
	}{
		{"pod at the threshold", ClassProduction, 1000, true, &threshold, ClassProduction},
		{"pod at the threshold asking Normal", ClassOpportunistic, 1000, true, &threshold, ClassProduction},
		{"pod below the threshold asking High", ClassProduction, 999, true, &threshold, ClassOpportunistic},
		{"pod unknown asking High", ClassProduction, 5000, false, &threshold, ClassOpportunistic},
		{"no threshold asking High", ClassProduction, 5000, true, nil, ClassOpportunistic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked int32
			s, sock, _ := startGuarded(t, GPUConfig{ProductionPriority: tc.threshold},
				Guards{PodPriority: func(pid int32) (int32, bool) { asked = pid; return tc.pod, tc.known }})
			dialRaw(t, sock, tc.asked)
			snap := s.Snapshot()
			if len(snap) != 1 || snap[0].Class != tc.want {
				t.Fatalf("clients = %+v, want one of class %s", snap, tc.want.String())
			}
			if asked != int32(os.Getpid()) {
				t.Fatalf("the pod was looked up for pid %d, want the peer's (SO_PEERCRED) %d", asked, os.Getpid())
			}
		})
	}
}

// The real shim with GPUSHARE_PRIORITY=high, in a pod below the production threshold, queues as
// opportunistic: it neither preempts the holder nor passes an earlier waiter. (The same client is
// production where the scheduler trusts its environment: TestHighPriorityShimClientGoesFirstAtHandOff.)
func TestShimAskingForHighPriorityGetsWhatItsPodAllows(t *testing.T) {
	build := shimBuild(t)
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, build: build, dir: dir, sock: filepath.Join(dir, "gpu.sock"), trace: filepath.Join(dir, "trace"),
		m: prometheus.NewRegistry()}
	threshold := int32(1000)
	e.s, err = New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: e.sock, Quantum: time.Minute, Grace: time.Minute,
		ProductionPriority: &threshold}},
		Registerer: e.m, Guards: Guards{PodPriority: func(int32) (int32, bool) { return 500, true }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.s.Close)

	holder := dialRaw(t, e.sock, ClassOpportunistic)
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
	asking := e.startClient([]string{"GPUSHARE_PRIORITY=high"}, "dlsym", "20", "1000")
	wait.Until(t, 2*time.Second, func() bool {
		s, ok := e.state(asking.pid())
		return ok && s.Waiting
	}, "the client asking for High queues")
	if s, _ := e.state(asking.pid()); s.Class != ClassOpportunistic {
		t.Fatalf("a client whose pod is below the production threshold is %s", s.Class.String())
	}
	if h, _ := e.state(os.Getpid()); !h.Holding || h.Preemptions != 0 {
		t.Fatalf("the holder was preempted by a client that only asked for production: %+v", h)
	}
	holder.send(Message{Type: MsgRelease, Epoch: epoch})
	normal.expect(MsgGrant, 2*time.Second) // the earlier normal waiter goes first
	if s, _ := e.state(asking.pid()); s.Holding {
		t.Fatal("the client that asked for production passed the earlier waiter")
	}
}
