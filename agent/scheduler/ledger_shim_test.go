package scheduler

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// Two shim processes of one claim fill what cuMemGetInfo offers each: together they stay within the claim
// as NVML counts it (their allocations plus a context reserve each), where a per-process limit let each
// take the whole claim; when one dies, its memory and its context's reserve go back to the other.
func TestTwoShimProcessesOfOneClaimHoldAtMostTheClaimTogether(t *testing.T) {
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
	tb, fb, gb, ob := fillResult(t, b)
	// With two processes the total is M - 2R; the first holds more than that already, so nothing is left.
	if tb != claim-2*testReserve || fb != 0 || gb != 0 || ob != 2 {
		t.Fatalf("second process: total %d free %d got %d over %d, want total %d and nothing free", tb, fb, gb, ob, claim-2*testReserve)
	}
	l, _ := ledgerOf(e.s)
	if l.Processes != 2 || l.Granted > claim-testReserve {
		t.Fatalf("ledger %+v", l)
	}
	// The first process ends (killed: its connection ends with it); the second's next look finds the room.
	_ = a.cmd.Process.Kill()
	<-a.done
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		l, _ := ledgerOf(e.s)
		return l.Processes == 1 && l.Granted == 0, fmt.Sprintf("%+v", l)
	}, "the dead process's grant returns to the ledger")
	c := e.startProgram("ledger_client", []string{limit}, "fill", hold+".c")
	tc, fc, gc, _ := fillResult(t, c)
	if tc != claim-2*testReserve || fc != tc || gc != fc {
		t.Fatalf("a process after the first died: total %d free %d got %d, want all of M - 2R = %d", tc, fc, gc, claim-2*testReserve)
	}
	l, _ = ledgerOf(e.s)
	if l.Granted+uint64(l.Processes)*testReserve > claim {
		t.Fatalf("ledger %+v beyond the claim", l)
	}
	for _, f := range []string{hold + ".b", hold + ".c"} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b.wait(t, 10*time.Second)
	c.wait(t, 10*time.Second)
}

func ledgerOf(s *Scheduler) (LedgerState, bool) {
	for _, l := range s.Ledgers() {
		if l.Key == testClaimKey {
			return l, true
		}
	}
	return LedgerState{}, false
}
