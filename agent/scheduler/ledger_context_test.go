package scheduler

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// fakeProcMem is NVML's per-process figure for this test process (the raw clients' kernel pid).
type fakeProcMem struct {
	mu   sync.Mutex
	used uint64
	set  bool
}

func (f *fakeProcMem) read(string) (map[int32]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.set {
		return map[int32]uint64{}, nil
	}
	return map[int32]uint64{int32(os.Getpid()): f.used}, nil
}

func (f *fakeProcMem) put(v uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used, f.set = v, true
}

func startContextEnv(t *testing.T, nvml *fakeProcMem) *ledgerEnv {
	t.Helper()
	return startLedgerEnvWith(t, func(g *Guards) {
		g.ContextReserve, g.ContextFloor = 768*mib, 256*mib
		g.ProcessMemory = nvml.read
	})
}

// fill charges chunks until the ledger refuses, with NVML counting ctx and everything granted as
// allocated (a process that fills what it is offered), and returns NVML's final figure.
func fill(t *testing.T, r *rawClient, nvml *fakeProcMem, ctx uint64) uint64 {
	t.Helper()
	var grant uint64
	nvml.put(ctx)
	for seq := uint32(1); seq < 1000; seq++ {
		m := charge(t, r, seq, testChunk)
		if m.Charge != ChargeOK {
			return ctx + grant
		}
		grant = m.Grant
		nvml.put(ctx + grant)
	}
	t.Fatal("the ledger never refused")
	return 0
}

func TestLedgerChargesAContextLargerThanTheReserveSoThePodStaysWithinItsClaim(t *testing.T) {
	nvml := &fakeProcMem{}
	e := startContextEnv(t, nvml)
	const claim = 8192 * mib
	a, first := e.dial(t, Claim{Key: testClaimKey, Memory: claim})
	if first.Total != claim-768*mib || first.Reserve != 768*mib {
		t.Fatalf("first Ledger = %+v, want the claim less R before NVML has a figure", first)
	}
	// two extra contexts (cuCtxCreate): 1,792 MiB of NVML's count before any allocation
	held := fill(t, a, nvml, 1792*mib)
	if held > claim {
		t.Fatalf("NVML counts %d MiB for a process of an 8 GiB claim that filled what it was offered: "+
			"the ledger charged R for a larger context", held/mib)
	}
	l, _ := e.ledger(testClaimKey)
	if l.Contexts != 1792*mib || l.Total != claim-1792*mib {
		t.Fatalf("ledger = %+v, want the measured context 1792 MiB charged", l)
	}
}

func TestLedgerOffersMoreWhereTheContextIsSmallerThanTheReserve(t *testing.T) {
	nvml := &fakeProcMem{}
	e := startContextEnv(t, nvml)
	const claim = 4096 * mib
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: claim})
	held := fill(t, a, nvml, 520*mib)
	if held > claim || held < claim-testChunk {
		t.Fatalf("NVML counts %d MiB for a process with a 520 MiB context that filled a 4 GiB claim: want "+
			"the claim less at most a chunk", held/mib)
	}
}

func TestLedgerContextChargeNeverBelowTheFloor(t *testing.T) {
	nvml := &fakeProcMem{}
	e := startContextEnv(t, nvml)
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 4096 * mib})
	nvml.put(100 * mib)
	if m := charge(t, a, 1, testChunk); m.Charge != ChargeOK || m.Total != 4096*mib-256*mib {
		t.Fatalf("Charged = %+v, want a total of the claim less the 256 MiB floor", m)
	}
}

func TestLedgerRefusesChargesWhileAMeasuredContextKeepsItBeyondTheClaim(t *testing.T) {
	nvml := &fakeProcMem{}
	e := startContextEnv(t, nvml)
	const claim = 2048 * mib
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: claim})
	nvml.put(768 * mib)
	if m := charge(t, a, 1, 1024*mib); m.Charge != ChargeOK {
		t.Fatalf("Charged = %+v, want 1 GiB granted", m)
	}
	// the context grows by 512 MiB after the grant (modules loaded at first use): grants + contexts pass
	// the claim, and no charge is granted until frees bring the ledger back
	nvml.put(768*mib + 1024*mib + 512*mib)
	if m := charge(t, a, 2, mib); m.Charge != ChargeRefused || m.Total != claim-1280*mib {
		t.Fatalf("Charged = %+v, want refused with the grown context charged", m)
	}
	a.send(Message{Type: MsgReturn, Bytes: 512 * mib})
	nvml.put(768*mib + 512*mib + 512*mib)
	if m := charge(t, a, 3, mib); m.Charge != ChargeOK {
		t.Fatalf("Charged = %+v after a return, want granted", m)
	}
}

// The same through the adapter the agent uses, over a go-nvml mock GPU: two extra contexts (1,792 MiB by
// NVML before any allocation) take the offer down by their size.
func TestLedgerContextChargeReadsNVMLThroughTheAgentsAdapter(t *testing.T) {
	srv := nvmlmock.NewA100(1)
	mock := srv.GPUs[0]
	read := ProcessMemoryFrom(gpu.NewNVML(srv))
	e := startLedgerEnvWith(t, func(g *Guards) {
		g.ContextReserve, g.ContextFloor = 768*mib, 256*mib
		g.ProcessMemory = func(string) (map[int32]uint64, error) { return read(mock.UUID) }
	})
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 8192 * mib})
	mock.SetProcessMemory(uint32(os.Getpid()), 1792*mib)
	if m := charge(t, a, 1, testChunk); m.Charge != ChargeOK || m.Total != 8192*mib-1792*mib {
		t.Fatalf("Charged = %+v, want the claim less NVML's 1792 MiB", m)
	}
}

// Between charges a GPU's ledgers are measured every second: a process that has not allocated yet is
// told the claim less its measured context, so a framework that sizes itself from cuMemGetInfo a moment
// after its context exists takes no more than the claim holds.
func TestLedgerMeasuresContextsBetweenCharges(t *testing.T) {
	nvml := &fakeProcMem{}
	e := startContextEnv(t, nvml)
	const claim = 4096 * mib
	a, first := e.dial(t, Claim{Key: testClaimKey, Memory: claim})
	if first.Total != claim-768*mib {
		t.Fatalf("first Ledger = %+v, want the claim less R", first)
	}
	nvml.put(1536 * mib)
	if m := a.expect(MsgLedger, 5*time.Second); m.Total != claim-1536*mib || m.Reserve != 1536*mib {
		t.Fatalf("Ledger after a measurement = %+v, want the claim less the 1536 MiB NVML counts", m)
	}
}

// A grant given back while NVML was read (frees it still counted) is not taken for context.
func TestLedgerMeasurementUsesTheLargestGrantSinceTheReadBegan(t *testing.T) {
	b := &ledgerBook{gpu: "GPU-m", reserve: 768 * mib, chunk: testChunk, floor: 256 * mib, byKey: map[string]*ledger{}}
	m := b.join(Claim{Key: "c", Memory: 8192 * mib}, true, 42, 6, func([]byte) bool { return true }, nil, 0)
	b.charge(m, 1, 2048*mib, 0)
	b.mu.Lock()
	m.peak = m.grant // the read begins
	b.mu.Unlock()
	if err := b.giveBack(m, 0, 1024*mib, false); err != nil { // 1 GiB freed and returned during the read
		t.Fatal(err)
	}
	b.measure(m.l, map[*member]uint64{m: 600*mib + 2048*mib}) // NVML read before the frees
	if m.ctx != 600*mib {
		t.Fatalf("context charge %d MiB, want 600 (NVML less the grant it was read against)", m.ctx/mib)
	}
}
