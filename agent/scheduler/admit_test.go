package scheduler

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// admitLog is a Guards.Admit that admits while allow is set and records every question.
type admitLog struct {
	allow   atomic.Bool
	mu      sync.Mutex
	asked   []time.Time
	gpus    []string
	pids    []int32
	refused int
}

func (a *admitLog) admit(gpu string, pid int32) (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, time.Now())
	a.gpus, a.pids = append(a.gpus, gpu), append(a.pids, pid)
	ok := a.allow.Load()
	if !ok {
		a.refused++
	}
	return ok, "its pod holds no share of " + gpu
}

// between counts the questions asked in [from, to).
func (a *admitLog) between(from, to time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, at := range a.asked {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

func (a *admitLog) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.asked)
}

// A process Admit refuses (its pod holds no share of the GPU) sees its connection closed after its HELLO
// without a WELCOME, never joins the GPU's clients and is counted as no-share; Admit is asked about the
// kernel's pid (SO_PEERCRED) and the socket's GPU. Admitted, the same process is welcomed at its next
// attempt (after RepeatWindow: a greeting within it is the refused attempt's).
func TestProcessWithoutAShareIsRefusedBeforeWelcome(t *testing.T) {
	var a admitLog
	clk := newFakeClock()
	s, sock, m := startGuardedAt(t, GPUConfig{}, Guards{Admit: a.admit}, clk)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, _ := Encode(Message{Type: MsgHello, PID: 1, GPUUUID: "GPU-test"}) // its word for its pid is 1
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	if closed, n := closedWithin(conn, 2*time.Second); !closed || n != 0 {
		t.Fatalf("refused process: closed=%v after %d bytes, want closed before any byte", closed, n)
	}
	if v := prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseNoShare)); v != 1 {
		t.Fatalf("no-share refusals = %v, want 1", v)
	}
	if got := s.Snapshot(); len(got) != 0 {
		t.Fatalf("clients after a refusal: %+v", got)
	}
	a.mu.Lock()
	gpus, pids := a.gpus, a.pids
	a.mu.Unlock()
	if len(pids) != 1 || pids[0] != int32(os.Getpid()) || gpus[0] != "GPU-test" {
		t.Fatalf("Admit asked about GPUs %v pids %v, want GPU-test and the peer's kernel pid %d", gpus, pids, os.Getpid())
	}

	a.allow.Store(true)
	clk.Advance(RepeatWindow)
	dialRaw(t, sock, ClassOpportunistic)
	if got := s.Snapshot(); len(got) != 1 {
		t.Fatalf("clients once admitted: %+v", got)
	}
	if v := prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseNoShare)); v != 1 {
		t.Fatalf("no-share refusals after an admitted connection = %v, want still 1", v)
	}
}

// Where the kernel names no peer, Admit cannot be asked: the connection is refused.
func TestPeerTheKernelDoesNotNameIsRefusedWhereAdmitIsSet(t *testing.T) {
	var a admitLog
	a.allow.Store(true)
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpu.sock")
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock}}, Metrics: m, Guards: Guards{Admit: a.admit}})
	if err != nil {
		t.Fatal(err)
	}
	s.peerPIDOf = func(net.Conn) int32 { return 0 } // a kernel that gives no SO_PEERCRED
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, _ := Encode(Message{Type: MsgHello, PID: uint32(os.Getpid()), GPUUUID: "GPU-test"})
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	if closed, n := closedWithin(conn, 2*time.Second); !closed || n != 0 {
		t.Fatalf("unnamed peer: closed=%v after %d bytes", closed, n)
	}
	if a.count() != 0 || prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseNoShare)) != 1 {
		t.Fatalf("Admit asked %d times, no-share refusals %v: want 0 and 1", a.count(),
			prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseNoShare)))
	}
}

// A shim whose connection closes at HELLO greets again one version lower; after a refusal that older
// greeting is the same attempt, refused without asking Admit again, so a process whose pod is found in
// the meantime is not admitted speaking an older protocol (no claim ledger) for the life of its connection.
// A shim greets each version three times before it steps down: a greeting of the same version within
// RepeatWindow is the same attempt too. Its next attempt, in its own version, is asked about.
func TestOlderGreetingAfterARefusalIsRefusedWithoutAsking(t *testing.T) {
	var a admitLog
	clk := newFakeClock()
	_, sock, m := startGuardedAt(t, GPUConfig{}, Guards{Admit: a.admit}, clk)
	greet := func(v uint16) (closed bool, n int) {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hello, _ := Encode(Message{Type: MsgHello, Version: v, PID: uint32(os.Getpid()), GPUUUID: "GPU-test"})
		if _, err := conn.Write(hello); err != nil {
			t.Fatal(err)
		}
		return closedWithin(conn, 2*time.Second)
	}
	if closed, n := greet(Version); !closed || n != 0 {
		t.Fatalf("refused greeting: closed=%v after %d bytes", closed, n)
	}
	a.allow.Store(true) // the pod is found now
	if closed, n := greet(Version); !closed || n != 0 {
		t.Fatalf("the same greeting again right after a refusal: closed=%v after %d bytes, want refused", closed, n)
	}
	if closed, n := greet(Version - 1); !closed || n != 0 {
		t.Fatalf("older greeting right after a refusal: closed=%v after %d bytes, want refused", closed, n)
	}
	if a.count() != 1 || prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseNoShare)) != 3 {
		t.Fatalf("Admit asked %d times, no-share refusals %v: want 1 and 3", a.count(),
			prom.CounterValue(t, m.refused.WithLabelValues("GPU-test", RefuseNoShare)))
	}
	clk.Advance(RepeatWindow)
	dialRaw(t, sock, ClassOpportunistic) // the next attempt, in the current version: asked, admitted
	if a.count() != 2 {
		t.Fatalf("Admit asked %d times, want 2", a.count())
	}
}

// The real shim refused at its first connect runs without the lock (its launches go on), warns once, and
// tries again in the background with back-off that settles at GPUSHARE_RECONNECT_MAX_MS (1 s): its
// attempts per second stay bounded, never a spin. Each attempt greets three times in each protocol
// version down to 3, all refused, Admit asked once. Once admitted it joins the GPU's clients within about a second, in the
// current protocol.
func TestRefusedShimRetriesWithBackoffAndJoinsOnceAdmitted(t *testing.T) {
	var a admitLog
	e := startEnvGuards(t, GPUConfig{Quantum: time.Minute}, Guards{Admit: a.admit})
	until := filepath.Join(e.dir, "stop")
	c := e.startClient([]string{"CLIENT_UNTIL_FILE=" + until}, "dlsym", "0", "2000")
	wait.Until(t, 5*time.Second, func() bool { return a.count() > 0 }, "the shim's first connect reaches Admit")
	first := time.Now()
	wait.Until(t, 5*time.Second, func() bool { return e.readTrace().count(c.pid()) >= 10 }, "the refused process launches without the lock")
	time.Sleep(3*time.Second - time.Since(first)) // the window whose attempts are counted
	total, lastSecond := a.between(first, first.Add(3*time.Second)), a.between(first.Add(2*time.Second), first.Add(3*time.Second))
	// Back-off 20 ms doubling to 1 s: about 8 attempts in the first 3 s, at most 2 in any second once at 1 s.
	if total > 12 || lastSecond > 2 {
		t.Fatalf("refused shim made %d attempts in 3 s, %d in the third second: want at most 12 and 2 (back-off, no spin)",
			total, lastSecond)
	}
	t.Logf("refused shim: %d attempts in 3 s, %d in the third second", total, lastSecond)
	if _, ok := e.state(c.pid()); ok {
		t.Fatal("a refused process is listed among the GPU's clients")
	}

	a.allow.Store(true)
	admitted := time.Now()
	wait.Until(t, 3*time.Second, func() bool { _, ok := e.state(c.pid()); return ok }, "the admitted shim joins the GPU's clients")
	t.Logf("joined %v after being admitted", time.Since(admitted).Round(10*time.Millisecond))
	if err := os.WriteFile(until, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 10*time.Second)
	stderr := c.stderr.String()
	if n := strings.Count(stderr, "cannot reach the GPU scheduler"); n != 1 || !strings.Contains(stderr, "connected to the GPU scheduler") {
		t.Errorf("want one warning that the scheduler cannot be reached, then one that it connected:\n%s", stderr)
	}
	if strings.Contains(stderr, "speaks protocol") {
		t.Errorf("the admitted shim connected in an older protocol:\n%s", stderr)
	}
	a.mu.Lock()
	refused := a.refused
	a.mu.Unlock()
	if got := e.counter("gpusharing_scheduler_connections_refused_total"); got != float64(3*(int(Version)-2)*refused) {
		t.Errorf("%v connections refused for %d refused attempts, want three greetings in each version from %d to 3 each", got, refused, Version)
	}
}
