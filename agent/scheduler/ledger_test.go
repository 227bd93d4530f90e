package scheduler

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpusharing/gpusharing/test/wait"
)

const (
	testReserve  = 256 * mib
	testChunk    = 64 * mib
	testClaimKey = "ns/claim"
)

// ledgerEnv is a scheduler whose clients take their claims, in the order they connect, from claims.
type ledgerEnv struct {
	s      *Scheduler
	sock   string
	reg    *prometheus.Registry
	claims chan Claim
}

func startLedgerEnv(t *testing.T, with ...func(*Guards)) *ledgerEnv {
	t.Helper()
	return startLedgerEnvWith(t, func(g *Guards) {
		for _, f := range with {
			f(g)
		}
	})
}

// startLedgerEnvWith is startLedgerEnv with guards changed by set.
func startLedgerEnvWith(t *testing.T, set func(*Guards)) *ledgerEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &ledgerEnv{sock: filepath.Join(dir, "gpu.sock"), reg: prometheus.NewRegistry(), claims: make(chan Claim, 16)}
	g := Guards{ContextReserve: testReserve, LedgerChunk: testChunk, ClaimOf: func(gpu string, _ int32) (Claim, bool) {
		if gpu != "GPU-test" {
			return Claim{}, false
		}
		select {
		case c := <-e.claims:
			return c, c.Key != ""
		default:
			return Claim{}, false
		}
	}}
	set(&g)
	e.s, err = New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: e.sock}}, Registerer: e.reg, Guards: g})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkLedgers(t, e.s) })
	t.Cleanup(e.s.Close)
	return e
}

// checkLedgers fails the test on any broken ledger invariant the scheduler recorded.
func checkLedgers(t *testing.T, s *Scheduler) {
	t.Helper()
	for _, q := range s.queues {
		b := s.book(q)
		b.mu.Lock()
		if len(b.broken) > 0 {
			t.Errorf("GPU %s: the ledgers broke their invariant: %v", q.uuid, b.broken)
		}
		b.mu.Unlock()
	}
}

// dial connects a raw client of claim c (Key "": none) and returns it with its first Ledger.
func (e *ledgerEnv) dial(t *testing.T, c Claim) (*rawClient, Message) {
	t.Helper()
	e.claims <- c
	r := dialRaw(t, e.sock, ClassOpportunistic)
	return r, r.ledger
}

func (e *ledgerEnv) ledger(key string) (LedgerState, bool) {
	for _, l := range e.s.Ledgers() {
		if l.Key == key {
			return l, true
		}
	}
	return LedgerState{}, false
}

func charge(t *testing.T, r *rawClient, seq uint32, bytes uint64) Message {
	t.Helper()
	r.send(Message{Type: MsgCharge, Seq: seq, Bytes: bytes})
	m := r.expect(MsgCharged, time.Second)
	if m.Seq != seq {
		t.Fatalf("Charged answers seq %d, want %d", m.Seq, seq)
	}
	return m
}

func TestLedgerGrantsInChunksUpToTheClaimLessTheContextReserve(t *testing.T) {
	e := startLedgerEnv(t)
	a, first := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if first.Flags != LedgerOn || first.Processes != 1 || first.Total != 768*mib || first.Claim != 1024*mib ||
		first.Reserve != testReserve || first.Bytes != testChunk {
		t.Fatalf("first Ledger = %+v, want on, 1 process, total 768 MiB of a 1024 MiB claim", first)
	}
	if m := charge(t, a, 1, mib); m.Charge != ChargeOK || m.Added != testChunk || m.Grant != testChunk {
		t.Fatalf("a charge of 1 MiB = %+v, want a chunk of 64 MiB", m)
	}
	if m := charge(t, a, 2, 700*mib); m.Charge != ChargeOK || m.Added != 700*mib || m.Granted != 764*mib {
		t.Fatalf("a charge of 700 MiB = %+v, want 700 MiB more", m)
	}
	if m := charge(t, a, 3, 5*mib); m.Charge != ChargeRefused || m.Added != 0 || m.Grant != 764*mib {
		t.Fatalf("a charge of 5 MiB with 4 MiB left = %+v, want refused", m)
	}
	if m := charge(t, a, 4, 4*mib); m.Charge != ChargeOK || m.Added != 4*mib {
		t.Fatalf("a charge of the last 4 MiB = %+v, want exactly them (less than a chunk is left)", m)
	}
	a.send(Message{Type: MsgReturn, Bytes: 100 * mib})
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		l, _ := e.ledger(testClaimKey)
		return l.Granted == 668*mib, l.Key
	}, "the returned bytes leave the grant")
	if l, _ := e.ledger(testClaimKey); l.Refusals != 1 || l.Total != 768*mib {
		t.Errorf("ledger %+v, want 1 refusal and a total of 768 MiB", l)
	}
}

func TestLedgerBoundsTheProcessesOfAClaimTogetherAndFreesADisconnectedOnesGrant(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 2048 * mib})
	if m := charge(t, a, 1, 1000*mib); m.Charge != ChargeOK {
		t.Fatalf("charge = %+v", m)
	}
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 2048 * mib})
	if bl.Processes != 2 || bl.Total != 1536*mib || bl.Granted != 1000*mib || bl.Grant != 0 {
		t.Fatalf("second process's Ledger = %+v, want 2 processes, total 1536 MiB, 1000 MiB granted", bl)
	}
	if m := a.expect(MsgLedger, time.Second); m.Processes != 2 || m.Total != 1536*mib {
		t.Fatalf("the first process learns %+v, want 2 processes and a total of 1536 MiB", m)
	}
	// What one process holds, the other cannot have: 536 MiB are left, not the 2048 MiB a per-process
	// limit would give each.
	if m := charge(t, b, 1, 600*mib); m.Charge != ChargeRefused {
		t.Fatalf("a charge beyond what the other process left = %+v, want refused", m)
	}
	if m := charge(t, b, 2, 536*mib); m.Charge != ChargeOK || m.Granted != 1536*mib {
		t.Fatalf("a charge of what is left = %+v", m)
	}
	_ = a.conn.Close() // the process is gone: its grant returns, and its context no longer counts
	m := b.expect(MsgLedger, time.Second)
	if m.Processes != 1 || m.Total != 1792*mib || m.Granted != 536*mib {
		t.Fatalf("after the first process left: %+v, want 1 process, total 1792 MiB, 536 MiB granted", m)
	}
	if m := charge(t, b, 3, 1256*mib); m.Charge != ChargeOK {
		t.Fatalf("a charge of the freed memory = %+v", m)
	}
	_ = b.conn.Close()
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		_, ok := e.ledger(testClaimKey)
		return !ok, "still listed"
	}, "a ledger without processes is forgotten")
}

// A process is admitted before its context exists: into a ledger whose grants leave no room for one more
// context reserve it is refused (it may not create a context), holds nothing and is not counted; the
// admitted process keeps its grant; a later process is admitted once frees make room.
func TestLedgerRefusesAProcessWhoseContextWouldPassTheClaim(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	charge(t, a, 1, 768*mib) // all that one process may allocate
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if bl.Flags != LedgerRefused || bl.Processes != 1 || bl.Granted != 768*mib || bl.Grant != 0 || bl.Claim != 1024*mib {
		t.Fatalf("Ledger of a process a full claim has no room for = %+v, want refused beside 1 process holding 768 MiB", bl)
	}
	if l, _ := e.ledger(testClaimKey); l.Processes != 1 || l.Granted != 768*mib || l.Total != 768*mib || l.Refusals != 1 {
		t.Fatalf("ledger after the refusal = %+v, want the refused process not counted", l)
	}
	if m, ok := a.next(MsgLedger, 200*time.Millisecond); ok {
		t.Fatalf("the admitted process learned %+v from a refusal, want nothing", m)
	}
	if m := charge(t, b, 1, mib); m.Charge != ChargeRefused {
		t.Fatalf("charge of a refused process = %+v, want refused", m)
	}
	_ = b.conn.Close() // it held nothing: nothing changes
	a.send(Message{Type: MsgReturn, Bytes: 300 * mib})
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		l, _ := e.ledger(testClaimKey)
		return l.Granted == 468*mib, "not yet"
	}, "the return leaves the grant")
	c, cl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib}) // 468 + 2 x 256 <= 1024
	if cl.Flags != LedgerOn || cl.Processes != 2 || cl.Total != 512*mib || cl.Granted != 468*mib {
		t.Fatalf("Ledger once frees made room = %+v, want admitted as the second of 2", cl)
	}
	if m := charge(t, c, 1, 44*mib); m.Charge != ChargeOK || m.Added != 44*mib {
		t.Fatalf("charge of the room left = %+v", m)
	}
}

// Started together, two processes are both admitted and their allocations together stay within M - 2R.
func TestLedgerAdmitsTwoProcessesThatStartBeforeEitherFills(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if bl.Flags != LedgerOn || bl.Processes != 2 || bl.Total != 512*mib {
		t.Fatalf("Ledger = %+v, want admitted, 2 processes, total 512 MiB", bl)
	}
	if m := charge(t, a, 1, 512*mib); m.Charge != ChargeOK {
		t.Fatalf("charge = %+v", m)
	}
	if m := charge(t, b, 1, mib); m.Charge != ChargeRefused {
		t.Fatalf("charge beyond M - 2R = %+v, want refused", m)
	}
	_ = a.conn.Close() // its grant and its context reserve return
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		l, _ := e.ledger(testClaimKey)
		return l.Processes == 1 && l.Granted == 0 && l.Total == 768*mib, "not yet"
	}, "a disconnect returns the grant and the context reserve")
}

// A claim smaller than one context reserve admits nothing.
func TestLedgerRefusesEveryProcessOfAClaimSmallerThanAContext(t *testing.T) {
	e := startLedgerEnv(t)
	_, al := e.dial(t, Claim{Key: testClaimKey, Memory: testReserve - 1})
	if al.Flags != LedgerRefused || al.Processes != 0 {
		t.Fatalf("Ledger = %+v, want refused", al)
	}
	if _, ok := e.ledger(testClaimKey); ok {
		t.Fatal("a ledger without an admitted process is listed")
	}
}

// seesTestProcess makes NVML show the test's process (every raw client's) holding 256 MiB on the GPU:
// the context floor, so a client's context is charged the floor once measured (at its first charge).
func seesTestProcess(g *Guards) {
	g.ProcessMemory = func(string) (map[int32]uint64, error) { return map[int32]uint64{int32(os.Getpid()): 256 * mib}, nil }
}

// A refused process that announces a grant (RETURN HOLD) and that NVML shows on the GPU has a context
// from before a scheduler restart: it is accounted, beyond the bound, and every charge is refused until
// the ledger is back within.
func TestLedgerAccountsAHoldFromARefusedProcess(t *testing.T) {
	e := startLedgerEnv(t, seesTestProcess)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	charge(t, a, 1, 768*mib)
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if bl.Flags != LedgerRefused {
		t.Fatalf("Ledger = %+v, want refused", bl)
	}
	b.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 10 * mib})
	if m := b.expect(MsgLedger, time.Second); m.Flags != LedgerOn || m.Processes != 2 || m.Grant != 10*mib || m.Granted != 778*mib {
		t.Fatalf("Ledger after the hold = %+v, want admitted with its 10 MiB", m)
	}
	if m := charge(t, a, 2, mib); m.Charge != ChargeRefused {
		t.Fatalf("charge into a ledger beyond its bound = %+v, want refused", m)
	}
}

// A refused process whose context NVML does not see announces a grant: its word does not pass the
// ledger. It stays refused, told so again, and the ledger keeps its bound.
func TestLedgerKeepsRefusingAHoldNVMLDoesNotSee(t *testing.T) {
	e := startLedgerEnv(t, func(g *Guards) {
		g.ProcessMemory = func(string) (map[int32]uint64, error) { return map[int32]uint64{}, nil }
	})
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	charge(t, a, 1, 768*mib)
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if bl.Flags != LedgerRefused {
		t.Fatalf("Ledger = %+v, want refused", bl)
	}
	b.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 10 * mib})
	if m := b.expect(MsgLedger, time.Second); m.Flags != LedgerRefused || m.Processes != 1 {
		t.Fatalf("Ledger after an unseen hold = %+v, want still refused beside the 1 admitted process", m)
	}
	if l, _ := e.ledger(testClaimKey); l.Processes != 1 || l.Granted != 768*mib {
		t.Fatalf("ledger after an unseen hold = %+v, want a's process and grant only", l)
	}
}

// A refused process's Hold that fits the ledger (its context and its bytes) admits it, NVML or not.
func TestLedgerAdmitsARefusedHoldThatFits(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	charge(t, a, 1, 768*mib)
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if bl.Flags != LedgerRefused {
		t.Fatalf("Ledger = %+v, want refused", bl)
	}
	a.send(Message{Type: MsgReturn, Bytes: 768 * mib}) // a's frees make room
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		l, _ := e.ledger(testClaimKey)
		return l.Granted == 0, fmt.Sprintf("granted %d", l.Granted)
	}, "a's grant returned")
	b.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 10 * mib})
	if m := b.expect(MsgLedger, time.Second); m.Flags != LedgerOn || m.Processes != 2 || m.Grant != 10*mib {
		t.Fatalf("Ledger after a hold that fits = %+v, want admitted with its 10 MiB", m)
	}
}

func TestLedgerAccountsAReannouncedGrantOnceAndDropsASecond(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	a.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 900 * mib}) // beyond the total: allocated already
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		l, _ := e.ledger(testClaimKey)
		return l.Granted == 900*mib, "not yet"
	}, "the held grant is accounted")
	if m := charge(t, a, 1, mib); m.Charge != ChargeRefused {
		t.Fatalf("charge beyond the total = %+v", m)
	}
	a.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 0})
	if m, ok := a.next(MsgType(0), 2*time.Second); ok {
		t.Fatalf("a client that re-announced twice got %+v, want its connection closed", m)
	}
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		_, ok := e.ledger(testClaimKey)
		return !ok, "still listed"
	}, "a client that re-announces twice is dropped and its grant returned")
}

func TestLedgerCountsOlderClientsWithoutSendingThemLedgers(t *testing.T) {
	e := startLedgerEnv(t)
	e.claims <- Claim{Key: testClaimKey, Memory: 1024 * mib}
	old := dialRawVersion(t, e.sock, ClassOpportunistic, 5)
	if m, ok := old.next(MsgLedger, 200*time.Millisecond); ok {
		t.Fatalf("a version 5 client got %+v", m)
	}
	a, al := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if al.Processes != 2 || al.Total != 512*mib {
		t.Fatalf("Ledger = %+v, want the version 5 process's context counted", al)
	}
	if m := charge(t, a, 1, 513*mib); m.Charge != ChargeRefused {
		t.Fatalf("charge = %+v", m)
	}
}

func TestClientWithoutAClaimIsToldSoAndRefused(t *testing.T) {
	e := startLedgerEnv(t)
	a, al := e.dial(t, Claim{})
	if al.Flags != 0 || al.Total != 0 {
		t.Fatalf("Ledger = %+v, want none", al)
	}
	if m := charge(t, a, 9, mib); m.Charge != ChargeRefused || m.Seq != 9 {
		t.Fatalf("charge without a ledger = %+v, want refused", m)
	}
}

func TestLedgerMetricsShowLimitAndGrantsPerClaim(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	charge(t, a, 1, 10*mib)
	got := map[string]float64{}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if labelOf(m, "claim") == testClaimKey {
				got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	want := map[string]float64{"gpusharing_scheduler_ledger_limit_bytes": 768 * mib, "gpusharing_scheduler_ledger_granted_bytes": 64 * mib,
		"gpusharing_scheduler_ledger_claim_bytes": 1024 * mib, "gpusharing_scheduler_ledger_processes": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// A client whose pod is unknown when it connects is outside every ledger; when the pod's re-resolution
// finds it, the client joins its claim's ledger and learns so. Its context exists already, so it is
// counted even in a full ledger (as a re-announced grant is), and every charge is refused until the
// ledger is back within its bound.
func TestClientWhosePodIsFoundLateJoinsItsClaimsLedger(t *testing.T) {
	var found atomic.Bool
	cl := Claim{Key: testClaimKey, Memory: 1024 * mib}
	s, sock, _ := startGuarded(t, GPUConfig{}, Guards{ContextReserve: testReserve, LedgerChunk: testChunk,
		PodPriority: func(pid int32) (int32, bool) { return 0, found.Load() || pid != int32(os.Getpid()) },
		ClaimOf: func(string, int32) (Claim, bool) {
			if !found.Load() {
				return Claim{}, false
			}
			return cl, true
		}})
	t.Cleanup(func() { checkLedgers(t, s) })
	late := dialRaw(t, sock, ClassOpportunistic)
	if late.ledger.Flags != 0 {
		t.Fatalf("Ledger of a client of unknown pod = %+v, want none", late.ledger)
	}
	found.Store(true)
	a := dialRaw(t, sock, ClassOpportunistic)
	if m := charge(t, a, 1, 768*mib); m.Charge != ChargeOK {
		t.Fatalf("charge = %+v", m)
	}
	m := late.expect(MsgLedger, 5*time.Second) // the re-resolution's first retry is ReResolveFirst away
	if m.Flags != LedgerOn || m.Processes != 2 || m.Granted != 768*mib || m.Grant != 0 {
		t.Fatalf("Ledger once the pod is found = %+v, want on, 2 processes", m)
	}
	late.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 10 * mib}) // what it allocated meanwhile
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		for _, l := range s.Ledgers() {
			if l.Key == testClaimKey {
				return l.Processes == 2 && l.Granted == 778*mib, fmt.Sprintf("%+v", l)
			}
		}
		return false, "no ledger"
	}, "the late client's context and memory are accounted")
	if m := charge(t, a, 2, mib); m.Charge != ChargeRefused {
		t.Fatalf("charge into a ledger beyond its bound = %+v, want refused", m)
	}
}

// onePod names every client of these tests (all in the test's process) one pod.
func onePod(g *Guards) { g.PeerKey = func(int32) string { return "pod:x" } }

// A process whose claim lookup fails joins the ledger another process of its pod resolved, rather than
// taking its own per-process limit beside it.
func TestLedgerProcessOfAResolvedPodJoinsItsLedgerWhenItsLookupFails(t *testing.T) {
	e := startLedgerEnv(t, onePod)
	a, al := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if al.Flags != LedgerOn {
		t.Fatalf("first Ledger = %+v, want on", al)
	}
	b, bl := e.dial(t, Claim{}) // its lookup fails
	if bl.Flags != LedgerOn || bl.Processes != 2 || bl.Claim != 1024*mib {
		t.Fatalf("Ledger of a process of the same pod whose lookup failed = %+v, want the pod's ledger with 2 processes", bl)
	}
	a.conn.Close()
	b.conn.Close()
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		e.s.peers.mu.Lock()
		defer e.s.peers.mu.Unlock()
		return len(e.s.peers.m) == 0 && len(e.s.peers.of) == 0, fmt.Sprintf("%d pods, %d clients", len(e.s.peers.m), len(e.s.peers.of))
	}, "the pod forgotten once its processes left")
}

// Processes of a pod that all connected while its lookup failed are placed in its ledger together as
// soon as a later lookup finds it for one of them.
func TestLedgerUnplacedProcessesOfAPodArePlacedTogether(t *testing.T) {
	e := startLedgerEnv(t, onePod)
	a, al := e.dial(t, Claim{})
	b, bl := e.dial(t, Claim{})
	if al.Flags != 0 || bl.Flags != 0 {
		t.Fatalf("Ledgers = %+v, %+v; want none while the pod is unknown", al, bl)
	}
	e.claims <- Claim{Key: testClaimKey, Memory: 1024 * mib} // the next lookup (a re-resolution) finds it
	for _, r := range []*rawClient{a, b} {
		if m := r.expect(MsgLedger, 5*time.Second); m.Flags != LedgerOn {
			t.Fatalf("Ledger after the pod was found = %+v, want on", m)
		}
	}
	wait.UntilState(t, 2*time.Second, func() (bool, string) {
		l, _ := e.ledger(testClaimKey)
		return l.Processes == 2, fmt.Sprintf("%+v", l)
	}, "both processes in the pod's ledger")
}
