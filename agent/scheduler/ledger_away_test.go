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
	select {
	case r := <-got:
		return r
	case <-time.After(10 * time.Second):
		p.t.Fatalf("no answer to %q; stderr:\n%s", fmt.Sprintf(format, args...), p.stderr.String())
		return ""
	}
}

// A process of a claim whose scheduler goes away (an agent restart) keeps to what the claim's ledger
// granted it until it is back, rather than to its per-process limit, which is the whole claim: with the
// limit alone it could hold the claim's allocations plus its context, more than the claim as NVML counts
// it. Back, the scheduler has its grant re-announced and lets it allocate again within the ledger.
// (The soak found it: make soak SOAK_SEED=1000 SOAK_SEEDS=1 SOAK_WITHOUT=lookup-fail, step 47.)
func TestShimKeepsToItsGrantWhileTheSchedulerIsAway(t *testing.T) {
	const claim = 1024 * mib
	guards := Guards{ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) { return Claim{Key: testClaimKey, Memory: claim}, true }}
	e := startEnvGuards(t, GPUConfig{Quantum: time.Minute}, guards)
	p := e.startSoakClient(fmt.Sprintf("GPUSHARE_MEMORY_LIMIT_BYTES=%d", claim), "GPUSHARE_LOG_LEVEL=info")
	if r := p.do("ctx 0"); r != "ctx 0 r=0" {
		t.Fatalf("context: %q", r)
	}
	if r := p.do("alloc 0 %d", 300*mib); r != "alloc 0 r=0" {
		t.Fatalf("first allocation within the ledger: %q\n%s", r, p.stderr.String())
	}

	e.s.Close() // the agent goes; the process notices its connection end
	wait.Until(t, 10*time.Second, func() bool { return strings.Contains(p.stderr.String(), "the GPU scheduler went away") },
		"the process saw its scheduler go")
	// M - R - 300 MiB = 468 MiB is all the ledger could ever grant it; its limit alone would allow 724 MiB.
	if r := p.do("alloc 0 %d", 500*mib); r != "alloc 0 r=2" {
		t.Fatalf("an allocation past what the ledger could grant, while the scheduler is away: %q, want out of memory (2)\n%s",
			r, p.stderr.String())
	}

	s, err := New(Options{GPUs: e.s.cfgs, Guards: guards, EnvOverrides: true, RebuildWindow: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { checkLedgers(t, s) })
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		l, _ := ledgerOf(s)
		return l.Processes == 1 && l.Granted >= 300*mib, fmt.Sprintf("%+v", l)
	}, "the process back in its ledger with what it holds announced")
	if r := p.do("alloc 0 %d", 400*mib); r != "alloc 0 r=0" {
		t.Fatalf("an allocation within the ledger once the scheduler is back: %q\n%s", r, p.stderr.String())
	}
	if l, _ := ledgerOf(s); l.Granted+testReserve > claim {
		t.Fatalf("ledger %+v beyond the claim", l)
	}
}
