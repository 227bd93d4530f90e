package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// rebuildLedgerEnv is a scheduler restarted on a socket its previous run left (a rebuild window of
// window), whose clients have the kernel pids given to dial, NVML figures per pid (nvml at the
// restart) and one claim.
type rebuildLedgerEnv struct {
	s    *Scheduler
	sock string
	pids chan int32

	mu   sync.Mutex
	nvml map[int32]uint64
}

func startRebuildLedgerEnv(t *testing.T, window time.Duration, claim Claim, nvml map[int32]uint64) *rebuildLedgerEnv {
	t.Helper()
	dir := t.TempDir()
	e := &rebuildLedgerEnv{sock: filepath.Join(dir, "gpu.sock"), pids: make(chan int32, 8), nvml: nvml}
	if err := os.WriteFile(restartMark(e.sock), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	e.s, err = New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: e.sock}}, RebuildWindow: window,
		Guards: Guards{ContextReserve: testReserve, ContextFloor: 16 * mib, LedgerChunk: testChunk,
			ClaimOf: func(string, int32) (Claim, bool) { return claim, true },
			ProcessMemory: func(string) (map[int32]uint64, error) {
				e.mu.Lock()
				defer e.mu.Unlock()
				out := map[int32]uint64{}
				for p, v := range e.nvml {
					out[p] = v
				}
				return out, nil
			}}})
	if err != nil {
		t.Fatal(err)
	}
	e.s.peerPIDOf = func(net.Conn) int32 { return <-e.pids }
	if err := e.s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkLedgers(t, e.s) })
	t.Cleanup(e.s.Close)
	return e
}

// ends: NVML no longer lists pid.
func (e *rebuildLedgerEnv) ends(pid int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.nvml, pid)
}

func (e *rebuildLedgerEnv) dial(t *testing.T, pid int32) *rawClient {
	t.Helper()
	e.pids <- pid
	return dialRaw(t, e.sock, ClassOpportunistic)
}

// Seed 3000 of the soak (docs/reliability.md, "Soak"), step 63: a process held 600 MiB of allocations
// beside its context when the scheduler restarted; it reconnected first, and a new process of its claim
// came before its Hold did.
func TestRestartedLedgerLeavesRoomForWhatItsEarlierClientsHoldBeforeTheyAnnounceIt(t *testing.T) {
	const claim = 1024 * mib
	e := startRebuildLedgerEnv(t, 10*time.Second, Claim{Key: testClaimKey, Memory: claim}, map[int32]uint64{101: testReserve + 600*mib})
	a := e.dial(t, 101)
	if a.ledger.Flags != LedgerOn {
		t.Fatalf("the earlier client's Ledger = %+v, want on", a.ledger)
	}
	b := e.dial(t, 102)
	if b.ledger.Flags != LedgerRefused {
		t.Fatalf("a new process's Ledger before the earlier one's Hold = %+v, want refused: its context "+
			"(%d MiB) beside the 600 MiB held and the earlier context would pass the %d MiB claim",
			b.ledger, testReserve/mib, claim/mib)
	}
	a.send(Message{Type: MsgReturn, Flags: ReturnHold, Bytes: 600 * mib})
	wait.For(t, time.Second, func() error {
		if l, _ := ledgerKeyed(e.s, testClaimKey); l.Granted != 600*mib {
			return fmt.Errorf("ledger %+v", l)
		}
		return nil
	}, "the Hold is accounted")
	if l, _ := ledgerKeyed(e.s, testClaimKey); l.Granted+l.Contexts > claim {
		t.Fatalf("ledger %+v beyond its claim after the Hold", l)
	}
	// A Charge within the window counts what is unannounced as well.
	if m := charge(t, a, 1, 200*mib); m.Charge != ChargeRefused {
		t.Fatalf("Charge of 200 MiB with %d MiB left = %+v, want refused", (claim-testReserve-600*mib)/mib, m)
	}
}

// The same with the earlier process not reconnected yet: NVML shows it on the GPU, its lookup names the
// claim, and the newcomer is refused.
func TestRestartedLedgerLeavesRoomForAnEarlierClientNotBackYet(t *testing.T) {
	const claim = 1024 * mib
	e := startRebuildLedgerEnv(t, 10*time.Second, Claim{Key: testClaimKey, Memory: claim}, map[int32]uint64{101: testReserve + 600*mib})
	b := e.dial(t, 102)
	if b.ledger.Flags != LedgerRefused {
		t.Fatalf("a new process's Ledger while an earlier one holding 600 MiB is not back = %+v, want refused", b.ledger)
	}
}

// Seed 5017 of the soak, step 144: an earlier process stopped (SIGSTOP) through the whole rebuild
// window is not back when it ends. It is counted until it is back or NVML lists it no more; nobody waits
// for it.
func TestRestartedLedgerCountsAnEarlierProcessUntilItIsBackOrGone(t *testing.T) {
	const claim = 1024 * mib
	e := startRebuildLedgerEnv(t, 200*time.Millisecond, Claim{Key: testClaimKey, Memory: claim}, map[int32]uint64{101: testReserve + 600*mib})
	wait.For(t, 5*time.Second, func() error {
		if e.s.queues[0].rebuilding() {
			return errors.New("rebuilding")
		}
		return nil
	}, "the rebuild window ends")
	if b := e.dial(t, 102); b.ledger.Flags != LedgerRefused {
		t.Fatalf("a new process's Ledger after the window, the earlier one not back = %+v, want refused", b.ledger)
	}
	e.ends(101)
	if c := e.dial(t, 103); c.ledger.Flags != LedgerOn {
		t.Fatalf("a new process's Ledger once the earlier one is gone = %+v, want on", c.ledger)
	}
}

func ledgerKeyed(s *Scheduler, key string) (LedgerState, bool) {
	for _, l := range s.Ledgers() {
		if l.Key == key {
			return l, true
		}
	}
	return LedgerState{}, false
}

// Seed 5043 of the soak, step 71: two restarts in a row. The second scheduler served no client before
// it was closed, but the earlier processes were not back: the third must still wait for them and count
// them.
func TestSchedulerClosedBeforeItsRebuildEndsLeavesTheRestartMark(t *testing.T) {
	const claim = 1024 * mib
	nvml := map[int32]uint64{101: testReserve + 600*mib}
	e := startRebuildLedgerEnv(t, 10*time.Second, Claim{Key: testClaimKey, Memory: claim}, nvml)
	e.s.Close()
	if _, err := os.Stat(restartMark(e.sock)); err != nil {
		t.Fatalf("no restart mark after a Close within the rebuild window: %v", err)
	}
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: e.sock}}, RebuildWindow: 10 * time.Second,
		Guards: e.s.opts.Guards})
	if err != nil {
		t.Fatal(err)
	}
	s.peerPIDOf = e.s.peerPIDOf
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if !s.queues[0].rebuilding() {
		t.Fatal("the next scheduler grants at once, as on a fresh node")
	}
	e.s = s
	if b := e.dial(t, 102); b.ledger.Flags != LedgerRefused {
		t.Fatalf("a new process's Ledger while the earlier one holding 600 MiB is not back = %+v, want refused", b.ledger)
	}
}
