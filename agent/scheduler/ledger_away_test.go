package scheduler

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// soakProc is shim/tests/soak_client under the shim: one command at a time, each answered.
type soakProc struct {
	t      *testing.T
	in     io.Writer
	out    *bufio.Scanner
	stderr lockedBuffer
}

func (e *env) startSoakClient(extraEnv ...string) *soakProc {
	e.t.Helper()
	p := &soakProc{t: e.t}
	cmd := exec.Command(filepath.Join(e.build, "tests", "soak_client"))
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+filepath.Join(e.build, "libgpushare.so"),
		"LD_LIBRARY_PATH="+filepath.Join(e.build, "stub"), "GPUSHARE_SOCKET="+e.sock, "GPUSHARE_GPU_UUID=GPU-test")
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stderr = &p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p.in, p.out = in, bufio.NewScanner(out)
	return p
}

// do sends one command and returns its answer.
func (p *soakProc) do(format string, args ...any) string {
	p.t.Helper()
	return p.answer(p.send(format, args...), fmt.Sprintf(format, args...))
}

// send sends one command; its answer comes on the channel returned.
func (p *soakProc) send(format string, args ...any) <-chan string {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.in, format+"\n", args...); err != nil {
		p.t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		if p.out.Scan() {
			got <- p.out.Text()
		}
		close(got)
	}()
	return got
}

// answer is the answer on got, within 10 s.
func (p *soakProc) answer(got <-chan string, what string) string {
	p.t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(10 * time.Second):
		p.t.Fatalf("no answer to %q; stderr:\n%s", what, p.stderr.String())
		return ""
	}
}

// awaitLog waits until the process has logged want at least n times; an answer on got before that fails
// the test (the command should have waited).
func (p *soakProc) awaitLog(got <-chan string, want string, n int) {
	p.t.Helper()
	wait.UntilState(p.t, 10*time.Second, func() (bool, string) {
		select {
		case r := <-got:
			p.t.Fatalf("answered %q before logging %q; stderr:\n%s", r, want, p.stderr.String())
		default:
		}
		return strings.Count(p.stderr.String(), want) >= n, p.stderr.String()
	}, "the process logs %q", want)
}

const awayWait = "wait for the GPU scheduler, which is away"

// A process of a claim whose scheduler goes away (an agent restart) allocates nothing past what it holds
// until the next scheduler decides: not up to its per-process limit (the whole claim, which with its
// context passes the claim as NVML counts it), and not within room the last scheduler granted it either,
// which the next one cannot see (NVML shows what a process holds, not what it may take): meanwhile the
// next one may admit another process of the claim, or find the claim resized. An allocation waits for
// the next connection and asks it. (The soak found both: make soak SOAK_SEED=1000 SOAK_SEEDS=1
// SOAK_WITHOUT=lookup-fail, step 47; make soak SOAK_SEED=301097 SOAK_SEEDS=1, step 65.)
func TestShimAsksTheNextSchedulerForMemoryWhileAway(t *testing.T) {
	const claim = 1024 * mib
	var resized atomic.Bool
	guards := Guards{ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) {
			if resized.Load() { // room for the context and 16 MiB
				return Claim{Key: testClaimKey, Memory: testReserve + 16*mib}, true
			}
			return Claim{Key: testClaimKey, Memory: claim}, true
		}}
	e := startEnvGuards(t, GPUConfig{Quantum: time.Minute}, guards)
	p := e.startSoakClient(fmt.Sprintf("GPUSHARE_MEMORY_LIMIT_BYTES=%d", claim), "GPUSHARE_LOG_LEVEL=info")
	if r := p.do("ctx 0"); r != "ctx 0 r=0" {
		t.Fatalf("context: %q", r)
	}
	if r := p.do("alloc 0 %d", 300*mib); r != "alloc 0 r=0" {
		t.Fatalf("first allocation within the ledger: %q\n%s", r, p.stderr.String())
	}
	if r := p.do("free 0"); r != "free 0 n=1" { // the shim keeps a chunk of its grant unused
		t.Fatalf("free: %q", r)
	}
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		l, _ := ledgerOf(e.s)
		return l.Granted == testChunk, fmt.Sprintf("%+v", l)
	}, "the process gives its grant back but a chunk, which it keeps unused")

	e.s.Close() // the agent goes; the process notices its connection end
	wait.Until(t, 10*time.Second, func() bool { return strings.Contains(p.stderr.String(), "the GPU scheduler went away") },
		"the process saw its scheduler go")
	got := p.send("alloc 0 %d", 32*mib) // within the chunk the last scheduler granted
	p.awaitLog(got, awayWait, 1)

	resized.Store(true)
	s, err := New(Options{GPUs: e.s.cfgs, Guards: guards, EnvOverrides: true, RebuildWindow: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { checkLedgers(t, s) })
	if r := p.answer(got, "alloc while away"); r != "alloc 0 r=2" {
		t.Fatalf("an allocation while the scheduler was away, past what the next one's ledger has room for: %q, "+
			"want out of memory (2)\n%s", r, p.stderr.String())
	}
	if r := p.do("alloc 0 %d", 16*mib); r != "alloc 0 r=0" {
		t.Fatalf("an allocation within the next scheduler's ledger: %q\n%s", r, p.stderr.String())
	}
	if l, _ := ledgerOf(s); l.Processes != 1 || l.Granted+testReserve > testReserve+16*mib {
		t.Fatalf("ledger %+v beyond the resized claim", l)
	}
}

// A scheduler that stays away costs one wait: the first allocation past what the process holds waits
// GPUSHARE_MEMREPLY_TIMEOUT_MS and fails with out of memory, later ones fail at once until the next
// connection.
func TestShimWaitsOnceForASchedulerThatStaysAway(t *testing.T) {
	const claim = 1024 * mib
	guards := Guards{ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) { return Claim{Key: testClaimKey, Memory: claim}, true }}
	e := startEnvGuards(t, GPUConfig{Quantum: time.Minute}, guards)
	p := e.startSoakClient(fmt.Sprintf("GPUSHARE_MEMORY_LIMIT_BYTES=%d", claim), "GPUSHARE_LOG_LEVEL=info",
		"GPUSHARE_MEMREPLY_TIMEOUT_MS=200")
	if r := p.do("ctx 0"); r != "ctx 0 r=0" {
		t.Fatalf("context: %q", r)
	}
	e.s.Close()
	wait.Until(t, 10*time.Second, func() bool { return strings.Contains(p.stderr.String(), "the GPU scheduler went away") },
		"the process saw its scheduler go")
	for i := range 2 {
		if r := p.do("alloc 0 %d", 32*mib); r != "alloc 0 r=2" {
			t.Fatalf("allocation %d with no scheduler: %q, want out of memory (2)\n%s", i, r, p.stderr.String())
		}
	}
	if n := strings.Count(p.stderr.String(), awayWait); n != 1 {
		t.Fatalf("%d waits for the scheduler, want 1\n%s", n, p.stderr.String())
	}
}
