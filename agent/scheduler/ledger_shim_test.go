package scheduler

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// startClaimEnv is startEnv with every client in one claim of claim bytes.
func startClaimEnv(t *testing.T, claim uint64) *env {
	t.Helper()
	e := startEnvGuards(t, GPUConfig{Quantum: time.Minute}, Guards{ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) { return Claim{Key: testClaimKey, Memory: claim}, true }})
	t.Cleanup(func() { checkLedgers(t, e.s) })
	return e
}

var fillLine = regexp.MustCompile(`ledger fill total=(\d+) free=(\d+) got=(\d+) over=(\d+)`)

// fillResult waits for a ledger_client's fill line: what cuMemGetInfo offered and what it got.
func fillResult(t *testing.T, p *proc) (total, free, got uint64, over int) {
	t.Helper()
	var m []string
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		m = fillLine.FindStringSubmatch(p.stdout.String())
		return m != nil && regexp.MustCompile("ledger holding").MatchString(p.stdout.String()), p.stdout.String() + p.stderr.String()
	}, "the client filled what cuMemGetInfo offered")
	v := func(i int) uint64 { n, _ := strconv.ParseUint(m[i], 10, 64); return n }
	return v(1), v(2), v(3), int(v(4))
}

// Two shim processes of one claim: the first fills what cuMemGetInfo offers it (the claim less one context
// reserve); the second connects when it creates its context, before the context exists, and is refused
// there with out of memory (the application sees the error and ends normally), so the claim as NVML counts
// it is never passed. The first process's allocations are untouched, and once it is gone a new process is
// admitted and offered all of M - R.
func TestShimContextRefusedWhenTheClaimIsFullLeavesTheOtherProcessWhole(t *testing.T) {
	const claim = 1024 * mib
	e := startClaimEnv(t, claim)
	limit := fmt.Sprintf("GPUSHARE_MEMORY_LIMIT_BYTES=%d", claim) // what the kubelet plugin sets: the claim
	hold := filepath.Join(e.dir, "hold")
	a := e.startProgram("ledger_client", []string{limit, "GPUSHARE_LOG_LEVEL=info"}, "fill", hold+".a")
	ta, fa, ga, oa := fillResult(t, a)
	if ta != claim-testReserve || fa != ta || ga != fa || oa != 2 {
		t.Fatalf("first process: total %d free %d got %d over %d, want total = free = got = claim - R = %d and the next MiB refused\n%s",
			ta, fa, ga, oa, claim-testReserve, a.stderr.String())
	}
	b := e.startProgram("ledger_client", []string{limit}, "fill", hold+".b")
	b.wait(t, 10*time.Second)
	if out := b.stdout.String(); !strings.Contains(out, "ledger ctx r=2\n") || strings.Contains(out, "ledger fill") {
		t.Fatalf("second process: %q, want its context refused with out of memory (2) and nothing allocated\n%s", out, b.stderr.String())
	}
	if !strings.Contains(b.stderr.String(), "may not create a CUDA context") {
		t.Errorf("the refused process does not say why: %s", b.stderr.String())
	}
	if l, _ := ledgerOf(e.s); l.Processes != 1 || l.Granted < claim-testReserve || l.Granted+testReserve > claim {
		t.Fatalf("ledger %+v, want the first process alone with its grant", l)
	}
	if err := os.WriteFile(hold+".a", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.wait(t, 10*time.Second)
	if !strings.Contains(a.stdout.String(), fmt.Sprintf("ledger freed free=%d", claim-testReserve)) {
		t.Fatalf("the first process after the refusal: %s, want all its memory freed and M - R free again", a.stdout.String())
	}
	c := e.startProgram("ledger_client", []string{limit}, "fill", hold+".c")
	if tc, fc, gc, _ := fillResult(t, c); tc != claim-testReserve || fc != tc || gc != fc {
		t.Fatalf("a process after the first ended: total %d free %d got %d, want all of M - R = %d", tc, fc, gc, claim-testReserve)
	}
	if err := os.WriteFile(hold+".c", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 10*time.Second)
}

// Two shim processes of one claim that both create their contexts before either fills are both admitted:
// each is offered M - 2R, the first takes it, the second finds nothing left, and together they stay within
// the claim as NVML counts it; when one dies, its memory and its context's reserve go back.
func TestTwoShimProcessesStartedTogetherHoldAtMostTheClaimTogether(t *testing.T) {
	const claim = 1024 * mib
	e := startClaimEnv(t, claim)
	limit := fmt.Sprintf("GPUSHARE_MEMORY_LIMIT_BYTES=%d", claim)
	hold, start := filepath.Join(e.dir, "hold"), filepath.Join(e.dir, "start")
	a := e.startProgram("ledger_client", []string{limit}, "fill", hold+".a", start+".a")
	b := e.startProgram("ledger_client", []string{limit}, "fill", hold+".b", start+".b")
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		l, _ := ledgerOf(e.s)
		return l.Processes == 2, fmt.Sprintf("%+v", l)
	}, "both processes admitted with their contexts")
	for _, f := range []string{start + ".a", start + ".b"} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		p := a
		if f == start+".b" {
			p = b
		}
		fillResult(t, p) // one after the other: the first takes what is offered, the second what is left
	}
	ta, fa, ga, _ := fillResult(t, a)
	tb, fb, gb, ob := fillResult(t, b)
	if ta != claim-2*testReserve || fa != ta || ga != fa || tb != ta || fb != 0 || gb != 0 || ob != 2 {
		t.Fatalf("a: total %d free %d got %d; b: total %d free %d got %d over %d; want both offered M - 2R = %d, a all of it, b nothing",
			ta, fa, ga, tb, fb, gb, ob, claim-2*testReserve)
	}
	if l, _ := ledgerOf(e.s); l.Processes != 2 || l.Granted+2*testReserve > claim {
		t.Fatalf("ledger %+v beyond the claim", l)
	}
	_ = a.cmd.Process.Kill() // its connection ends with it
	<-a.done
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		l, _ := ledgerOf(e.s)
		return l.Processes == 1 && l.Granted == 0, fmt.Sprintf("%+v", l)
	}, "the dead process's grant and context reserve return to the ledger")
	if err := os.WriteFile(hold+".b", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.wait(t, 10*time.Second)
}

func ledgerOf(s *Scheduler) (LedgerState, bool) {
	for _, l := range s.Ledgers() {
		if l.Key == testClaimKey {
			return l, true
		}
	}
	return LedgerState{}, false
}
