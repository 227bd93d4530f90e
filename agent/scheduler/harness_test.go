package scheduler

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Harness for the integration tests: the real shim (shim/build/libgpushare.so),
// the stub driver and C test clients, built once with make, driven against a
// scheduler running in this process.

var (
	buildOnce sync.Once
	buildErr  error
	buildDir  string
)

func shimBuild(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs C processes")
	}
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		shimDir := filepath.Join(filepath.Dir(file), "..", "..", "shim")
		out, err := exec.Command("make", "-s", "-C", shimDir, "testbins").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("make -C shim testbins: %v\n%s", err, out)
			return
		}
		buildDir, buildErr = filepath.Abs(filepath.Join(shimDir, "build"))
	})
	if buildErr != nil {
		t.Fatalf("building the shim and its test programs failed (needs gcc and make): %v", buildErr)
	}
	return buildDir
}

type env struct {
	t     *testing.T
	build string
	dir   string
	sock  string
	trace string
	s     *Scheduler
	m     *prometheus.Registry
}

// newEnv starts a scheduler for one GPU with the given quantum and grace.
func newEnv(t *testing.T, quantum, grace time.Duration) *env {
	t.Helper()
	return startEnv(t, GPUConfig{Quantum: quantum, Grace: grace})
}

// startEnv starts a scheduler for one GPU, "GPU-test", configured as cfg, on a socket in a fresh directory.
func startEnv(t *testing.T, cfg GPUConfig) *env {
	t.Helper()
	return startEnvGuards(t, cfg, Guards{})
}

// startEnvGuards is startEnv with the scheduler's Guards.
func startEnvGuards(t *testing.T, cfg GPUConfig, guards Guards) *env {
	t.Helper()
	build := shimBuild(t)
	// Short path: a Unix socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, build: build, dir: dir, sock: filepath.Join(dir, "gpu.sock"), trace: filepath.Join(dir, "trace"),
		m: prometheus.NewRegistry()}
	cfg.UUID, cfg.SocketPath = "GPU-test", e.sock
	// EnvOverrides: the tests set the shims' timeouts short through their environments.
	e.s, err = New(Options{GPUs: []GPUConfig{cfg}, Registerer: e.m, Guards: guards, EnvOverrides: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after Close: the clients' ends are checked too
		for _, q := range e.s.queues {
			q.mu.Lock()
			if len(q.violations) > 0 {
				t.Errorf("GPU %s: the queue saw %d broken invariants: %v", q.uuid, len(q.violations), q.violations)
			}
			q.mu.Unlock()
		}
	})
	t.Cleanup(e.s.Close)
	return e
}

func (e *env) counter(name string) float64 {
	mfs, err := e.m.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// lockedBuffer collects a child's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type proc struct {
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer
	done           chan struct{}
	err            error
}

// startClient runs shim/tests/client under the shim with the stub driver.
func (e *env) startClient(extraEnv []string, args ...string) *proc {
	e.t.Helper()
	return e.startProgram("client", extraEnv, args...)
}

// startProgram runs shim/tests/<name> under the shim with the stub driver.
func (e *env) startProgram(name string, extraEnv []string, args ...string) *proc {
	e.t.Helper()
	return e.startWrapped(nil, name, extraEnv, args...)
}

// startWrapped is startProgram through wrap, which returns the command line that runs argv with the
// shim preloaded (a freezer.Cgroup's Wrap: the program in a container's cgroup); nil runs it directly.
func (e *env) startWrapped(wrap func(preload string, argv ...string) []string, name string, extraEnv []string, args ...string) *proc {
	e.t.Helper()
	p := &proc{done: make(chan struct{})}
	argv, preload := append([]string{filepath.Join(e.build, "tests", name)}, args...), filepath.Join(e.build, "libgpushare.so")
	env := []string{"LD_PRELOAD=" + preload}
	if wrap != nil {
		argv, env = wrap(preload, argv...), nil
	}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(append(os.Environ(), env...),
		"LD_LIBRARY_PATH="+filepath.Join(e.build, "stub"),
		"GPUSHARE_SOCKET="+e.sock,
		"GPUSHARE_GPU_UUID=GPU-test",
		"GPUSHARE_STUB_TRACE="+e.trace,
		"GPUSHARE_STUB_LAUNCH_US=1000",
	)
	p.cmd.Env = append(p.cmd.Env, extraEnv...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a test binary killed by -timeout
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	e.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// wait fails the test unless the client exits successfully within d.
func (p *proc) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("client %d still running after %v; stderr:\n%s", p.pid(), d, p.stderr.String())
	}
	if p.err != nil || !strings.Contains(p.stdout.String(), "client done") {
		t.Fatalf("client %d failed: %v\nstdout:\n%s\nstderr:\n%s", p.pid(), p.err, p.stdout.String(), p.stderr.String())
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitQueued waits until the scheduler has handled the acquisitions that must wait: n clients wait and
// exactly one holds. A grant to a waiter that should wait shows as a timeout here, with the states.
func (e *env) waitQueued(t *testing.T, n int) {
	t.Helper()
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		st := e.s.Snapshot()
		waiting, holding := 0, 0
		for _, c := range st {
			if c.Waiting {
				waiting++
			}
			if c.Holding {
				holding++
			}
		}
		return waiting == n && holding == 1, fmt.Sprintf("%d waiting, %d holding: %+v", waiting, holding, st)
	}, "%d clients wait and one holds the lock", n)
}

func (e *env) state(pid int) (ClientState, bool) {
	for _, c := range e.s.Snapshot() {
		if int(c.PID) == pid {
			return c, true
		}
	}
	return ClientState{}, false
}

// ---- the stub driver's trace ----

type interval struct {
	pid        int
	name       string // the entry point that queued it
	start, end int64  // CLOCK_MONOTONIC ns
}

type trace struct {
	lastCall   map[int]int64 // per pid, the time of its last work call (Q record)
	work       []interval
	syncInCapt int // cuCtxSynchronize called while a stream captured
}

func (e *env) readTrace() trace {
	e.t.Helper()
	f, err := os.Open(e.trace)
	if err != nil {
		if os.IsNotExist(err) {
			return trace{lastCall: map[int]int64{}}
		}
		e.t.Fatal(err)
	}
	defer f.Close()
	tr := trace{lastCall: map[int]int64{}}
	open := map[int]interval{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			e.t.Fatalf("bad trace line %q", sc.Text())
		}
		pid, _ := strconv.Atoi(fields[1])
		ts, _ := strconv.ParseInt(fields[2], 10, 64)
		switch fields[0] {
		case "Q":
			tr.lastCall[pid] = max(tr.lastCall[pid], ts)
		case "B":
			open[pid] = interval{pid: pid, name: strings.Join(fields[3:], " "), start: ts}
		case "E":
			if w, ok := open[pid]; ok {
				w.end = ts
				tr.work = append(tr.work, w)
				delete(open, pid)
			}
		case "X":
			tr.syncInCapt++
		}
	}
	sort.Slice(tr.work, func(i, j int) bool { return tr.work[i].start < tr.work[j].start })
	return tr
}

// overlaps returns a description of the first pair of intervals of different
// processes that overlap in time, or "".
func (tr trace) overlaps() string {
	for i, a := range tr.work {
		for _, b := range tr.work[i+1:] {
			if b.start >= a.end {
				break
			}
			if b.pid != a.pid {
				return fmt.Sprintf("pid %d [%d,%d] overlaps pid %d [%d,%d]", a.pid, a.start, a.end, b.pid, b.start, b.end)
			}
		}
	}
	return ""
}

// count is the number of launches (cuLaunch*, cuGraphLaunch*) pid ran.
func (tr trace) count(pid int) int {
	n := 0
	for _, w := range tr.work {
		if w.pid == pid && (strings.HasPrefix(w.name, "cuLaunch") || strings.HasPrefix(w.name, "cuGraphLaunch")) {
			n++
		}
	}
	return n
}

// switches counts how often consecutive work items changed process.
func (tr trace) switches() int {
	n := 0
	for i := 1; i < len(tr.work); i++ {
		if tr.work[i].pid != tr.work[i-1].pid {
			n++
		}
	}
	return n
}

// ---- a protocol-level client, for holders that misbehave on purpose ----

type rawClient struct {
	t    *testing.T
	conn net.Conn
	in   chan Message
	// ledger is the Ledger that follows the Welcome of a version 6 client (ledger.go).
	ledger  Message
	welcome Message
}

func dialRaw(t *testing.T, sock string, prio Class) *rawClient {
	t.Helper()
	return dialRawVersion(t, sock, prio, 0)
}

// dialRawVersion is dialRaw speaking protocol version v (0: the current one).
func dialRawVersion(t *testing.T, sock string, prio Class, v uint16) *rawClient {
	t.Helper()
	return dialHello(t, sock, Message{Type: MsgHello, Version: v, PID: uint32(os.Getpid()), Priority: prio, GPUUUID: "GPU-test"})
}

// dialHello connects to sock and says hello, then waits for the Welcome (and the Ledger that follows
// it for version 6 on).
func dialHello(t *testing.T, sock string, hello Message) *rawClient {
	t.Helper()
	v := hello.Version
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := &rawClient{t: t, conn: conn, in: make(chan Message, 64)}
	r.send(hello)
	go func() {
		defer close(r.in)
		for {
			m, err := ReadMessage(conn)
			if err != nil {
				return
			}
			r.in <- m
		}
	}()
	r.welcome = r.expect(MsgWelcome, time.Second)
	if v == 0 || v >= 6 {
		r.ledger = r.expect(MsgLedger, time.Second)
	}
	return r
}

func (r *rawClient) send(m Message) {
	r.t.Helper()
	b, err := Encode(m)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.conn.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// expect waits for a message of type typ, skipping others; fails the test on timeout.
func (r *rawClient) expect(typ MsgType, d time.Duration) Message {
	r.t.Helper()
	m, ok := r.next(typ, d)
	if !ok {
		r.t.Fatalf("no %v within %v", typ, d)
	}
	return m
}

func (r *rawClient) next(typ MsgType, d time.Duration) (Message, bool) {
	timeout := time.After(d)
	for {
		select {
		case m, ok := <-r.in:
			if !ok {
				return Message{}, false
			}
			if m.Type == typ {
				return m, true
			}
		case <-timeout:
			return Message{}, false
		}
	}
}

func (r *rawClient) hold() uint32 {
	r.t.Helper()
	r.send(Message{Type: MsgAcquire})
	return r.expect(MsgGrant, 2*time.Second).Epoch
}
