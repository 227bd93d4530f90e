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

// A process whose claim lookup fails is in no ledger until a lookup finds its claim: no ledger is sized
// by what the pod says of itself. When the lookups answer again, the first new process of the pod
// places the pod's processes still outside in the claim's ledger before it joins, so the claim's ledger
// admits it beside them (seed 6010 of the soak, step 119: a newcomer admitted to an empty ledger while
// its pod's others were elsewhere), not before the re-resolution (500 ms on) gets to them.
func TestAPodsProcessesOutsideJoinTheClaimBeforeANewcomer(t *testing.T) {
	const claim = 1024 * mib
	var found atomic.Bool
	pids := make(chan int32, 4)
	sock := filepath.Join(t.TempDir(), "gpu.sock")
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock}}, Guards: Guards{
		ContextReserve: testReserve, LedgerChunk: testChunk,
		ClaimOf: func(string, int32) (Claim, bool) {
			return Claim{Key: testClaimKey, Memory: claim}, found.Load()
		},
		PeerKey: func(int32) string { return "pod:a" },
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
	if a.ledger.Flags != 0 {
		t.Fatalf("Ledger of a process whose pod lookup fails = %+v, want none", a.ledger)
	}
	if l := s.Ledgers(); len(l) != 0 {
		t.Fatalf("ledgers while the pod's lookup fails = %+v, want none", l)
	}
	found.Store(true)
	pids <- 202
	b := dialRaw(t, sock, ClassOpportunistic)
	if b.ledger.Flags != LedgerOn || b.ledger.Processes != 2 {
		t.Fatalf("Ledger of the pod's new process = %+v, want on beside the pod's first process (2 processes)", b.ledger)
	}
	if m := a.expect(MsgLedger, time.Second); m.Flags != LedgerOn {
		t.Fatalf("Ledger of the pod's first process once the newcomer found the claim = %+v, want on", m)
	}
	wait.For(t, 10*time.Second, func() error {
		if l, ok := ledgerKeyed(s, testClaimKey); !ok || l.Processes != 2 {
			return fmt.Errorf("ledgers %+v", s.Ledgers())
		}
		return nil
	}, "both processes in the claim's ledger")
}
