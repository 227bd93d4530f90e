package scheduler

import (
	"context"
	"os"
	"path/filepath"
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

func startLedgerEnv(t *testing.T) *ledgerEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &ledgerEnv{sock: filepath.Join(dir, "gpu.sock"), reg: prometheus.NewRegistry(), claims: make(chan Claim, 16)}
	e.s, err = New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: e.sock}}, Registerer: e.reg,
		Guards: Guards{ContextReserve: testReserve, LedgerChunk: testChunk, ClaimOf: func(gpu string, _ int32) (Claim, bool) {
			if gpu != "GPU-test" {
				return Claim{}, false
			}
			select {
			case c := <-e.claims:
				return c, c.Key != ""
			default:
				return Claim{}, false
			}
		}}})
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
	r := dialRaw(t, e.sock, PriorityNormal)
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

func TestLedgerJoinedWhenFullRefusesUntilFreesBringItWithin(t *testing.T) {
	e := startLedgerEnv(t)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	charge(t, a, 1, 768*mib)
	// The second process's context exists whatever the ledger says: the ledger is beyond its total.
	b, bl := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if bl.Total != 512*mib || bl.Granted != 768*mib {
		t.Fatalf("Ledger = %+v", bl)
	}
	if m := charge(t, b, 1, mib); m.Charge != ChargeRefused {
		t.Fatalf("charge into a ledger beyond its total = %+v, want refused", m)
	}
	a.send(Message{Type: MsgReturn, Bytes: 300 * mib})
	if m := b.expect(MsgLedger, time.Second); m.Granted != 468*mib {
		t.Fatalf("after a return: %+v", m)
	}
	if m := charge(t, b, 2, 44*mib); m.Charge != ChargeOK || m.Added != 44*mib {
		t.Fatalf("charge of the room the return made = %+v", m)
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
	old := dialRawVersion(t, e.sock, PriorityNormal, 5)
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
