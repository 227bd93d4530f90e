package scheduler

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Seed 3020 of the soak (docs/reliability.md, "Soak"), step 34: processes of one pod connect while its
// pod lookup fails. They share a provisional ledger of the limit their shims run under, and move to
// their claim's ledger, grant and all, once a lookup answers.
func TestProcessesOfAPodWhoseLookupFailsShareOneLedgerOfTheirLimit(t *testing.T) {
	const limit = 1024 * mib
	var found atomic.Bool
	pids := make(chan int32, 4)
	sock := filepath.Join(t.TempDir(), "gpu.sock")
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock}}, Guards: Guards{
		ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) {
			return Claim{Key: testClaimKey, Memory: limit}, found.Load()
		},
		PeerKey:  func(int32) string { return "pod:a" },
		PodLimit: func(string, int32) (uint64, bool) { return limit, true },
	}})
	if err != nil {
		t.Fatal(err)
	}
	s.peerPIDOf = func(net.Conn) int32 { return <-pids }
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkLedgers(t, s) })
	t.Cleanup(s.Close)

	pids <- 201
	a := dialRaw(t, sock, ClassOpportunistic)
	if a.ledger.Flags != LedgerOn || a.ledger.Claim != limit {
		t.Fatalf("Ledger of a process whose pod lookup fails = %+v, want on, in a ledger of its %d MiB limit", a.ledger, limit/mib)
	}
	if m := charge(t, a, 1, 600*mib); m.Charge != ChargeOK {
		t.Fatalf("Charge = %+v, want granted", m)
	}
	pids <- 202
	if b := dialRaw(t, sock, ClassOpportunistic); b.ledger.Flags != LedgerRefused {
		t.Fatalf("Ledger of the pod's second process = %+v, want refused: its context beside the first's "+
			"context and 600 MiB would pass the pod's %d MiB", b.ledger, limit/mib)
	}
	found.Store(true)
	wait.For(t, 10*time.Second, func() error {
		l, ok := ledgerKeyed(s, testClaimKey)
		if !ok || l.Processes != 1 || l.Granted < 600*mib {
			return fmt.Errorf("ledgers %+v", s.Ledgers())
		}
		return nil
	}, "the process is in its claim's ledger with its grant")
}

// Seed 6010 of the soak, step 119: the lookups answer again, and a new process of the pod is looked up
// before the scheduler's re-resolution has moved the pod's others out of the provisional ledger. It
// joins the claim's ledger only after they do: a pod's processes are never in two ledgers at once.
func TestAPodsProvisionalProcessesJoinTheClaimBeforeANewcomer(t *testing.T) {
	const limit = 1024 * mib
	var found atomic.Bool
	pids := make(chan int32, 4)
	sock := filepath.Join(t.TempDir(), "gpu.sock")
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock}}, Guards: Guards{
		ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) {
			return Claim{Key: testClaimKey, Memory: limit}, found.Load()
		},
		PeerKey:  func(int32) string { return "pod:a" },
		PodLimit: func(string, int32) (uint64, bool) { return limit, true },
	}})
	if err != nil {
		t.Fatal(err)
	}
	s.peerPIDOf = func(net.Conn) int32 { return <-pids }
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkLedgers(t, s) })
	t.Cleanup(s.Close)

	pids <- 201
	a := dialRaw(t, sock, ClassOpportunistic)
	if m := charge(t, a, 1, 600*mib); m.Charge != ChargeOK {
		t.Fatalf("Charge in the provisional ledger = %+v, want granted", m)
	}
	found.Store(true) // the re-resolution is 500 ms away
	pids <- 202
	if b := dialRaw(t, sock, ClassOpportunistic); b.ledger.Flags != LedgerRefused {
		t.Fatalf("Ledger of the pod's new process = %+v, want refused: the claim's ledger holds the pod's "+
			"first process (its context and 600 MiB) by then", b.ledger)
	}
}
