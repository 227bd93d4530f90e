package scheduler

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/prom"
)

// newQoSFixture is a queue configured as cfg (UUID "GPU-test"; the quantum and grace of the budget
// tests where cfg leaves them zero), its clients' classes coming from their pods where they join with
// pod().
func newQoSFixture(t *testing.T, cfg GPUConfig) *queueFixture {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cfg.UUID = "GPU-test"
	if cfg.Quantum == 0 {
		cfg.Quantum, cfg.Grace = 100*time.Millisecond, 50*time.Millisecond
	}
	clock := newFakeClock()
	fx := &queueFixture{q: newQueue(cfg, clock, m, logr.Discard()), clock: clock, m: m}
	fx.checkViolations(t)
	return fx
}

// pod is the class source of a client whose pod's priority is v (its hello asks for nothing).
func pod(v int32) classSource { return classSource{fromPod: true, value: v, known: true} }

func threshold(v int32) *int32 { return &v }

func (fx *queueFixture) reservation(f *fakeClient) uint64 {
	fx.q.mu.Lock()
	defer fx.q.mu.Unlock()
	return f.c.reservation
}

func (fx *queueFixture) waiting(f *fakeClient) bool {
	fx.q.mu.Lock()
	defer fx.q.mu.Unlock()
	return f.c.state == stateWaiting
}

// A production client that asks while an opportunistic client holds is granted in the same call: the
// holder is told REVOKED at once, with no quantum and no grace, and the preemption is counted apart
// from revocations.
func TestProductionPreemptsAnOpportunisticHolderAtOnce(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Quantum: time.Minute, Grace: time.Minute, ProductionPriority: threshold(1000)})
	o, p := fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	fx.q.acquire(o.c, 0)
	epoch := grantEpoch(t, o)
	fx.q.acquire(p.c, 0)
	if fx.holder() != p.c {
		t.Fatal("the production client was not granted in the dispatch of its acquire")
	}
	if r, ok := o.last(MsgRevoked); !ok || r.Epoch != epoch {
		t.Fatalf("the opportunistic holder got %+v (%v), want REVOKED of epoch %d", r, ok, epoch)
	}
	if o.count(MsgContended) != 0 {
		t.Error("the opportunistic holder was told to yield after its quantum instead of being preempted")
	}
	if got := prom.CounterValue(t, fx.m.preemptions.WithLabelValues("GPU-test")); got != 1 {
		t.Errorf("preemptions_total = %v, want 1", got)
	}
	if got := prom.CounterValue(t, fx.m.revocations.WithLabelValues("GPU-test")); got != 0 {
		t.Errorf("revocations_total = %v, want 0: a preemption is not an overdue revocation", got)
	}
	s := fx.q.snapshot()
	if s[0].Preemptions != 1 || s[0].Revocations != 0 || s[0].Holding {
		t.Errorf("the preempted client's state = %+v", s[0])
	}
	fx.q.release(o.c, epoch, 0) // its RELEASE of the revoked epoch crosses the REVOKED: ignored
	if fx.holder() != p.c {
		t.Fatal("a stale release of the preempted epoch ended the production hold")
	}
}

// While production holds, an opportunistic waiter neither runs nor makes production yield: no
// CONTENDED, no revocation however long it waits. It runs when production releases (its idle gap).
func TestOpportunisticWaitsForProductionToRelease(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	p, o := fx.joinAs(t, pod(2000)), fx.joinAs(t, pod(10))
	fx.q.acquire(p.c, 0)
	fx.q.acquire(o.c, 0)
	fx.clock.Advance(10 * time.Second) // far past quantum + grace
	if fx.holder() != p.c || p.count(MsgContended) != 0 || p.count(MsgRevoked) != 0 {
		t.Fatalf("production holder: holds=%v, contended %d, revoked %d; want it left alone",
			fx.holder() == p.c, p.count(MsgContended), p.count(MsgRevoked))
	}
	fx.q.release(p.c, grantEpoch(t, p), 0)
	if fx.holder() != o.c {
		t.Fatal("the opportunistic waiter did not run when production released")
	}
}

// With a budget that fits both, an opportunistic waiter still waits while production holds (Auto runs
// clients together only within a class).
func TestOpportunisticIsNotGrantedBesideProductionEvenWhenItFits(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAuto, ProductionPriority: threshold(1000)})
	p, o := fx.joinAs(t, pod(1000)), fx.joinAs(t, pod(0))
	fx.q.acquire(p.c, 10*mib)
	fx.q.acquire(o.c, 10*mib)
	if fx.holding(o) || !fx.waiting(o) {
		t.Fatal("an opportunistic client was granted beside a production holder")
	}
	fx.q.release(p.c, grantEpoch(t, p), 10*mib)
	if !fx.holding(o) {
		t.Fatal("the opportunistic waiter did not run when production released")
	}
}

// Production clients among themselves keep the lock's rules: the waiter is second in line, the holder
// is told of it and revoked after quantum + grace, and no preemption is counted.
func TestProductionAgainstProductionKeepsQuantumAndRevocation(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	a, b := fx.joinAs(t, pod(1000)), fx.joinAs(t, pod(5000))
	fx.q.acquire(a.c, 0)
	fx.q.acquire(b.c, 0)
	if fx.holder() != a.c || a.count(MsgContended) != 1 || a.count(MsgRevoked) != 0 {
		t.Fatalf("after the second production acquire: holder %v, contended %d, revoked %d",
			fx.holder(), a.count(MsgContended), a.count(MsgRevoked))
	}
	fx.clock.Advance(149 * time.Millisecond)
	if a.count(MsgRevoked) != 0 {
		t.Fatal("revoked before quantum + grace")
	}
	fx.clock.Advance(time.Millisecond)
	if a.count(MsgRevoked) != 1 || fx.holder() != b.c {
		t.Fatal("not revoked, or the waiter not granted, at quantum + grace")
	}
	if got := prom.CounterValue(t, fx.m.preemptions.WithLabelValues("GPU-test")); got != 0 {
		t.Errorf("preemptions_total = %v between production clients", got)
	}
}

// An opportunistic client's need never evicts production memory: it takes what the budget and other
// opportunistic clients can give, and where only production memory would do, it waits (nothing is
// evicted) until production gives it up.
func TestOpportunisticNeverEvictsProductionMemory(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAlways, ProductionPriority: threshold(1000)})
	p, idle, o := fx.joinAs(t, pod(1000)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(0))
	for _, f := range []*fakeClient{idle, p} { // p ran last: least recently run is the other one
		fx.q.acquire(f.c, 30*mib)
		fx.report(f, UsageReport, 30*mib, 30*mib)
		fx.clock.Advance(time.Millisecond)
		fx.q.release(f.c, grantEpoch(t, f), 30*mib)
	}
	fx.report(idle, UsageReport, 20*mib, 20*mib) // idle keeps 20, p 30: 14 free
	fx.q.acquire(o.c, 40*mib)                    // 14 free + 20 of idle's < 40: only p's memory would do
	fx.clock.Advance(time.Second)
	if fx.holding(o) || p.count(MsgEvict) != 0 || idle.count(MsgEvict) != 0 {
		t.Fatalf("o holding=%v, evictions p=%d idle=%d: want o waiting and nothing evicted",
			fx.holding(o), p.count(MsgEvict), idle.count(MsgEvict))
	}
	if fx.reservation(p) != 30*mib {
		t.Fatalf("production reservation %d MiB, want 30", fx.reservation(p)/mib)
	}
	fx.q.leave(p.c)
	if !fx.holding(o) {
		t.Fatal("the opportunistic waiter did not run once production's memory was released")
	}
}

// Where opportunistic memory can make room, an opportunistic need takes it and leaves production's alone,
// even when the production client ran longer ago.
func TestOpportunisticNeedEvictsOnlyOpportunisticMemory(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAlways, ProductionPriority: threshold(1000)})
	p, idle, o := fx.joinAs(t, pod(1000)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(0))
	for _, f := range []*fakeClient{p, idle} { // p ran longest ago
		fx.q.acquire(f.c, 25*mib)
		fx.report(f, UsageReport, 25*mib, 25*mib)
		fx.clock.Advance(time.Millisecond)
		fx.q.release(f.c, grantEpoch(t, f), 25*mib)
	}
	fx.q.acquire(o.c, 30*mib) // 14 free: 16 must go
	if p.count(MsgEvict) != 0 {
		t.Fatal("production memory was evicted for an opportunistic client")
	}
	if e, ok := idle.last(MsgEvict); !ok || e.Target != 9*mib {
		t.Fatalf("idle opportunistic client's evict = %+v (%v), want target 9 MiB", e, ok)
	}
}

// A production need evicts opportunistic memory before production memory, whichever ran last.
func TestProductionNeedEvictsOpportunisticMemoryFirst(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAlways, ProductionPriority: threshold(1000)})
	idleProd, o, p := fx.joinAs(t, pod(1000)), fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	for _, f := range []*fakeClient{idleProd, o} { // the production client ran longest ago
		fx.q.acquire(f.c, 25*mib)
		fx.report(f, UsageReport, 25*mib, 25*mib)
		fx.clock.Advance(time.Millisecond)
		fx.q.release(f.c, grantEpoch(t, f), 25*mib)
	}
	fx.q.acquire(p.c, 30*mib) // 14 free: 16 must go
	if idleProd.count(MsgEvict) != 0 {
		t.Fatal("idle production memory was evicted while opportunistic memory could make room")
	}
	if e, ok := o.last(MsgEvict); !ok || e.Target != 9*mib {
		t.Fatalf("opportunistic client's evict = %+v (%v), want target 9 MiB", e, ok)
	}
	if !fx.holding(p) {
		t.Fatal("production not granted while the eviction covers what it misses")
	}
}

// Production preempting an opportunistic holder on a full budget is granted in the same call, with
// the free budget (it fills in as the preempted client, idle now, is evicted for only what production
// misses).
func TestProductionPreemptsOnAFullBudgetAndEvictsOnlyWhatItNeeds(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAlways, Quantum: time.Minute, Grace: time.Minute,
		ProductionPriority: threshold(1000)})
	o, p := fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	fx.q.acquire(o.c, 40*mib)
	fx.report(o, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(p.c, 40*mib)
	if o.count(MsgRevoked) != 1 || !fx.holding(p) {
		t.Fatalf("opportunistic revoked %d times, production holding=%v; want preempted and granted at once",
			o.count(MsgRevoked), fx.holding(p))
	}
	if g, _ := p.last(MsgGrant); g.Resident != 24*mib {
		t.Fatalf("production granted with %d MiB, want the 24 free", g.Resident/mib)
	}
	if e, ok := o.last(MsgEvict); !ok || e.Target != 24*mib {
		t.Fatalf("evict = %+v (%v), want the preempted client asked down to 24 MiB: only what production misses", e, ok)
	}
	fx.report(o, UsageEvicted, 40*mib, 24*mib)
	if r, ok := p.last(MsgRaise); !ok || r.Resident != 40*mib {
		t.Fatalf("raise = %+v (%v), want production's whole need", r, ok)
	}
}

// A production need that fits the free budget evicts nothing from the preempted holder.
func TestProductionPreemptionEvictsNothingWhenItsNeedFits(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{Budget: 64 * mib, Mode: ModeAlways, ProductionPriority: threshold(1000)})
	o, p := fx.joinAs(t, pod(0)), fx.joinAs(t, pod(1000))
	fx.q.acquire(o.c, 40*mib)
	fx.q.acquire(p.c, 20*mib)
	if !fx.whole(p) || o.count(MsgEvict) != 0 || o.count(MsgRevoked) != 1 {
		t.Fatalf("production whole=%v, opportunistic evicted %d revoked %d", fx.whole(p), o.count(MsgEvict), o.count(MsgRevoked))
	}
}

// A process whose hello asks for High in a pod below the threshold is opportunistic: it waits behind
// the opportunistic holder like anyone else and preempts nobody.
func TestHelloAskingHighInAPodBelowTheThresholdIsOpportunistic(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	o := fx.joinAs(t, pod(0))
	claim := fx.joinAs(t, classSource{asked: ClassProduction, fromPod: true, value: 999, known: true})
	fx.q.acquire(o.c, 0)
	fx.q.acquire(claim.c, 0)
	if fx.holder() != o.c || o.count(MsgRevoked) != 0 || !fx.waiting(claim) {
		t.Fatal("a client that only asked for production preempted the holder")
	}
	if s := fx.q.snapshot(); s[1].Class != ClassOpportunistic {
		t.Fatalf("its class = %v, want opportunistic", s[1].Class)
	}
}

// A new threshold classifies the connected clients again: a waiter moves to its new class's line in
// the order it asked, and a holder that is now opportunistic while a production client waits is
// preempted at once.
func TestReconfigureReclassifiesWaitersAndHolders(t *testing.T) {
	cfg := GPUConfig{UUID: "GPU-test", Quantum: time.Minute, Grace: time.Minute, ProductionPriority: threshold(1000)}
	fx := newQoSFixture(t, cfg)
	holder := fx.joinAs(t, pod(1000))
	o1, x, o2, p := fx.joinAs(t, pod(500)), fx.joinAs(t, pod(800)), fx.joinAs(t, pod(100)), fx.joinAs(t, pod(1500))
	fx.q.acquire(holder.c, 0)
	for _, f := range []*fakeClient{o1, x, o2, p} { // in this order, a millisecond apart
		fx.q.acquire(f.c, 0)
		fx.clock.Advance(time.Millisecond)
	}
	cfg.ProductionPriority = threshold(800) // x becomes production: it asked before p
	fx.q.reconfigure(cfg)
	fx.q.mu.Lock()
	prod, opp := append([]*client(nil), fx.q.waiting[ClassProduction]...), append([]*client(nil), fx.q.waiting[ClassOpportunistic]...)
	fx.q.mu.Unlock()
	if len(prod) != 2 || prod[0] != x.c || prod[1] != p.c || len(opp) != 2 || opp[0] != o1.c || opp[1] != o2.c {
		t.Fatalf("lines after the threshold fell to 800: production %v, opportunistic %v; want [x p] and [o1 o2]", ids(prod), ids(opp))
	}
	if holder.count(MsgRevoked) != 0 {
		t.Fatal("a production holder was revoked by a reclassification that left it production")
	}

	cfg.ProductionPriority = threshold(1200) // the holder and x are opportunistic now; p waits
	fx.q.reconfigure(cfg)
	if holder.count(MsgRevoked) != 1 || fx.holder() != p.c {
		t.Fatalf("holder revoked %d times, GPU held by %v: want the holder, now opportunistic, preempted for p",
			holder.count(MsgRevoked), fx.holder())
	}
	fx.q.mu.Lock()
	opp = append([]*client(nil), fx.q.waiting[ClassOpportunistic]...)
	fx.q.mu.Unlock()
	if len(opp) != 3 || opp[0] != o1.c || opp[1] != x.c || opp[2] != o2.c {
		t.Fatalf("opportunistic line %v, want [o1 x o2] by the time each asked", ids(opp))
	}

	cfg.ProductionPriority = nil // nobody is production
	fx.q.reconfigure(cfg)
	if s := fx.q.gpuState(); s.ProductionPriority != nil {
		t.Fatalf("threshold in force %v after it was removed", *s.ProductionPriority)
	}
	for _, c := range fx.q.snapshot() {
		if c.Class != ClassOpportunistic {
			t.Fatalf("client %d still production without a threshold", c.ID)
		}
	}
}

// A holder that became production after an opportunistic waiter contended it is not revoked for that
// waiter: the revocation armed before keeps it holding when it fires.
func TestHolderMadeProductionIsNotRevokedForAnOpportunisticWaiter(t *testing.T) {
	cfg := GPUConfig{Quantum: 100 * time.Millisecond, Grace: 50 * time.Millisecond, ProductionPriority: threshold(1000)}
	fx := newQoSFixture(t, cfg)
	h, w := fx.joinAs(t, pod(800)), fx.joinAs(t, pod(0))
	fx.q.acquire(h.c, 0)
	fx.q.acquire(w.c, 0) // contends h: its revocation is armed
	if h.count(MsgContended) != 1 {
		t.Fatal("an opportunistic holder was not told that an opportunistic client waits")
	}
	cfg.ProductionPriority = threshold(800)
	fx.q.reconfigure(cfg)
	fx.clock.Advance(time.Second)
	if h.count(MsgRevoked) != 0 || fx.holder() != h.c {
		t.Fatal("a production holder was revoked for an opportunistic waiter")
	}
}

func ids(cs []*client) []uint32 {
	out := make([]uint32, len(cs))
	for i, c := range cs {
		out[i] = c.id
	}
	return out
}

// paces lists the PACE bounds f was sent, in order.
func paces(f *fakeClient) []uint32 { return sentValues(f, MsgPace) }

// idles lists the IDLE windows f was told, in order.
func idles(f *fakeClient) []uint32 { return sentValues(f, MsgIdle) }

// sentValues lists the value of each PACE or IDLE f was sent, in order.
func sentValues(f *fakeClient, typ MsgType) []uint32 {
	var out []uint32
	for _, m := range f.got {
		switch {
		case m.Type == typ && typ == MsgPace:
			out = append(out, m.MaxQueued)
		case m.Type == typ && typ == MsgIdle:
			out = append(out, m.IdleUS)
		case m.Type == typ && typ == MsgSettle:
			out = append(out, m.FloorUS)
		case m.Type == typ && typ == MsgPaceTime:
			out = append(out, m.QueueUS)
		}
	}
	return out
}

func sameValues(got []uint32, want ...uint32) bool { return slices.Equal(got, want) }

// PACE goes to the opportunistic clients of version 4 only, with the configured depth while a
// production client is busy (it waits, holds, or did within ProductionRecent) and 0 once none is, each
// value once; a client joining while production is busy gets it right after its WELCOME. A production
// client that is connected and idle paces nobody.
func TestPaceFollowsBusyProduction(t *testing.T) {
	fx := newQoSFixture(t, GPUConfig{ProductionPriority: threshold(1000)})
	o := fx.joinAs(t, pod(0))
	fx.version = 3
	o3 := fx.joinAs(t, pod(0))
	fx.version = MinVersion
	o2 := fx.joinAs(t, pod(0))
	fx.version = 0
	if len(paces(o)) != 0 {
		t.Fatalf("PACE %v without any production client", paces(o))
	}
	p1 := fx.joinAs(t, pod(1000))
	if len(paces(o)) != 0 {
		t.Fatalf("PACE %v beside a production client that is connected and idle", paces(o))
	}
	fx.q.acquire(p1.c, 0)
	if !sameValues(paces(o), DefaultOpportunisticQueue) {
		t.Fatalf("opportunistic client paced %v when production asked for the GPU, want [%d]", paces(o), DefaultOpportunisticQueue)
	}
	fx.q.release(p1.c, grantEpoch(t, p1), 0)
	fx.clock.Advance(ProductionRecent - time.Millisecond)
	if !sameValues(paces(o), DefaultOpportunisticQueue) {
		t.Fatalf("paced %v within ProductionRecent of production's last hold, want the bound kept", paces(o))
	}
	fx.clock.Advance(time.Millisecond)
	if !sameValues(paces(o), DefaultOpportunisticQueue, 0) {
		t.Fatalf("paced %v ProductionRecent after production's last hold, want the bound lifted", paces(o))
	}
	fx.q.acquire(p1.c, 0)
	if !sameValues(paces(o), DefaultOpportunisticQueue, 0, DefaultOpportunisticQueue) {
		t.Fatalf("paced %v when production asked again, want the bound back", paces(o))
	}
	p2 := fx.joinAs(t, pod(2000))
	fx.q.acquire(p2.c, 0)
	late := fx.joinAs(t, pod(0))
	if !sameValues(paces(o), DefaultOpportunisticQueue, 0, DefaultOpportunisticQueue) {
		t.Fatalf("paced %v after a second production client asked: the value was repeated", paces(o))
	}
	if len(late.got) != 3 || late.got[0].Type != MsgWelcome || late.got[1].Type != MsgPaceTime ||
		late.got[2].Type != MsgPace || late.got[2].MaxQueued != DefaultOpportunisticQueue {
		t.Fatalf("a client joining beside production got %+v, want WELCOME, PACE_TIME, then PACE %d", late.got,
			DefaultOpportunisticQueue)
	}
	fx.q.leave(p1.c)
	if !sameValues(paces(o), DefaultOpportunisticQueue, 0, DefaultOpportunisticQueue) {
		t.Fatalf("paced %v while a production client still holds", paces(o))
	}
	fx.q.leave(p2.c)
	if !sameValues(paces(o), DefaultOpportunisticQueue, 0, DefaultOpportunisticQueue, 0) || !sameValues(paces(late), DefaultOpportunisticQueue, 0) {
		t.Fatalf("after the last production client left: paced %v and %v, want the bound lifted (0) once", paces(o), paces(late))
	}
	for _, f := range []*fakeClient{o3, o2, p1, p2} {
		if n := f.count(MsgPace); n != 0 {
			t.Errorf("client %d (version %d, %s) got %d PACE", f.c.id, f.c.version, f.c.class.String(), n)
		}
	}
}

// A new depth reaches the paced clients once; a client made production is released from its bound.
func TestPaceFollowsTheDepthAndTheClass(t *testing.T) {
	cfg := GPUConfig{Quantum: time.Second, Grace: time.Second, ProductionPriority: threshold(1000), OpportunisticQueue: 4}
	fx := newQoSFixture(t, cfg)
	o, x := fx.joinAs(t, pod(0)), fx.joinAs(t, pod(500))
	fx.q.acquire(fx.joinAs(t, pod(1000)).c, 0)
	if !sameValues(paces(o), 4) || !sameValues(paces(x), 4) {
		t.Fatalf("paced %v and %v, want the configured 4", paces(o), paces(x))
	}
	cfg.OpportunisticQueue = 8
	fx.q.reconfigure(cfg)
	fx.q.reconfigure(cfg)
	if !sameValues(paces(o), 4, 8) {
		t.Fatalf("paced %v after the depth changed to 8 (twice), want [4 8]", paces(o))
	}
	cfg.ProductionPriority = threshold(500) // x becomes production
	fx.q.reconfigure(cfg)
	if !sameValues(paces(x), 4, 8, 0) || !sameValues(paces(o), 4, 8) {
		t.Fatalf("after x became production: x paced %v, o %v; want x unbounded (0), o unchanged", paces(x), paces(o))
	}
	cfg.OpportunisticQueue = 0 // the default
	fx.q.reconfigure(cfg)
	if !sameValues(paces(o), 4, 8, DefaultOpportunisticQueue) {
		t.Fatalf("paced %v after the depth was reset, want the default %d last", paces(o), DefaultOpportunisticQueue)
	}
}

// IDLE goes to the production clients of version 5 only: ProductionIdle while an opportunistic client
// is busy (it waits, holds, or did within RecentActivity) and 0 once none is, each value once; a
// production client joining beside busy opportunistic ones gets it right after its WELCOME; a client
// whose class changes hears its new window. An opportunistic client connected and idle changes nothing.
func TestIdleFollowsBusyOpportunisticClientsAndTheClass(t *testing.T) {
	cfg := GPUConfig{Quantum: time.Second, Grace: time.Second, ProductionPriority: threshold(1000)}
	fx := newQoSFixture(t, cfg)
	short := uint32(ProductionIdle / time.Microsecond)
	p := fx.joinAs(t, pod(1000))
	fx.version = 4
	p4 := fx.joinAs(t, pod(1000))
	fx.version = 0
	if len(idles(p)) != 0 {
		t.Fatalf("IDLE %v without any opportunistic client", idles(p))
	}
	x := fx.joinAs(t, pod(500))
	if len(idles(p)) != 0 {
		t.Fatalf("production told %v beside an opportunistic client that is connected and idle", idles(p))
	}
	fx.q.acquire(x.c, 0)
	if !sameValues(idles(p), short) {
		t.Fatalf("production told %v when an opportunistic client asked for the GPU, want [%d]", idles(p), short)
	}
	o := fx.joinAs(t, pod(0))
	fx.q.acquire(o.c, 0)
	late := fx.joinAs(t, pod(2000))
	if !sameValues(idles(p), short) {
		t.Fatalf("told %v after a second opportunistic client joined: the value was repeated", idles(p))
	}
	if len(late.got) != 3 || late.got[0].Type != MsgWelcome || late.got[1].Type != MsgSettle ||
		late.got[1].FloorUS != uint32(DefaultSettleFloor/time.Microsecond) || late.got[2].Type != MsgIdle ||
		late.got[2].IdleUS != short {
		t.Fatalf("a production client joining beside opportunistic ones got %+v, want WELCOME, SETTLE %d, IDLE %d",
			late.got, DefaultSettleFloor/time.Microsecond, short)
	}
	cfg.ProductionPriority = threshold(500) // x becomes production beside o
	fx.q.reconfigure(cfg)
	if !sameValues(idles(x), short) {
		t.Fatalf("x told %v when it became production, want [%d]", idles(x), short)
	}
	fx.q.leave(o.c)
	if !sameValues(idles(p), short, 0) || !sameValues(idles(x), short, 0) || !sameValues(idles(late), short, 0) {
		t.Fatalf("after the last opportunistic client left: told %v, %v and %v, want their own windows back (0) once",
			idles(p), idles(x), idles(late))
	}
	cfg.ProductionPriority = threshold(1000) // x is opportunistic again, beside p and late
	fx.q.reconfigure(cfg)
	if !sameValues(idles(x), short, 0) || !sameValues(idles(p), short, 0, short) {
		t.Fatalf("after x became opportunistic: x told %v, p %v; want x nothing new, p the short window again", idles(x), idles(p))
	}
	if n := p4.count(MsgIdle); n != 0 {
		t.Errorf("a version 4 production client got %d IDLE", n)
	}
	for _, f := range []*fakeClient{o} {
		if n := f.count(MsgIdle); n != 0 {
			t.Errorf("opportunistic client %d got %d IDLE", f.c.id, n)
		}
	}
}

// Through the socket: the pod's priority decides the class, PACE reaches the opportunistic client when
// production connects, and Scheduler.Reconfigure with a new threshold classifies the connected clients
// again.
func TestSchedulerReconfigureReclassifiesConnectedClients(t *testing.T) {
	var mu sync.Mutex
	podOf := []int32{500, 2000} // the pods of the connections, in the order they say hello
	s, sock, _ := startGuarded(t, GPUConfig{Quantum: time.Second, ProductionPriority: threshold(1000)},
		Guards{PodPriority: func(int32) (int32, bool) {
			mu.Lock()
			defer mu.Unlock()
			v := podOf[0]
			podOf = podOf[1:]
			return v, true
		}})
	o := dialRaw(t, sock, ClassProduction)
	dialRaw(t, sock, ClassOpportunistic).hold()
	if m := o.expect(MsgPace, 2*time.Second); m.MaxQueued != DefaultOpportunisticQueue {
		t.Fatalf("PACE %d when production took the GPU, want %d", m.MaxQueued, DefaultOpportunisticQueue)
	}
	if c := s.Snapshot(); c[0].Class != ClassOpportunistic || c[1].Class != ClassProduction {
		t.Fatalf("classes %v and %v, want opportunistic (pod 500) and production (pod 2000)", c[0].Class, c[1].Class)
	}
	cfg := s.cfgs[0]
	cfg.ProductionPriority = threshold(400)
	if err := s.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if g := s.GPUs()[0]; g.ProductionPriority == nil || *g.ProductionPriority != 400 {
		t.Fatalf("threshold in force %v, want 400", g.ProductionPriority)
	}
	if c := s.Snapshot(); c[0].Class != ClassProduction {
		t.Fatalf("the client of pod 500 is %v under a threshold of 400", c[0].Class)
	}
	if m := o.expect(MsgPace, 2*time.Second); m.MaxQueued != 0 {
		t.Fatalf("PACE %d after it became production, want 0", m.MaxQueued)
	}
}

// A client that asked for High and got opportunistic is logged once, at V(1), when it joins; a client
// whose hello decides, or that asked for nothing, is not.
func TestAskingHighInAnOpportunisticPodIsLoggedOnceAtV1(t *testing.T) {
	count := func(verbosity int) int {
		var mu sync.Mutex
		n := 0
		log := funcr.New(func(_, args string) {
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(args, "its pod makes it opportunistic") {
				n++
			}
		}, funcr.Options{Verbosity: verbosity})
		m, err := newMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		cfg := GPUConfig{UUID: "GPU-test", Quantum: time.Second, Grace: time.Second, ProductionPriority: threshold(1000)}
		q := newQueue(cfg, newFakeClock(), m, log)
		for _, src := range []classSource{
			{asked: ClassProduction, fromPod: true, value: 10, known: true},
			{asked: ClassProduction},                                          // the hello decides: production
			{fromPod: true, value: 10, known: true},                           // asked for nothing
			{asked: ClassProduction, fromPod: true, value: 1000, known: true}, // production
		} {
			q.join(1, src, 0, func([]byte) bool { return true }, func() {})
		}
		q.reconfigure(cfg)
		mu.Lock()
		defer mu.Unlock()
		return n
	}
	if n := count(1); n != 1 {
		t.Errorf("%d log lines at V(1) about a client asking for High in an opportunistic pod, want 1", n)
	}
	if n := count(0); n != 0 {
		t.Errorf("%d such lines at V(0), want none", n)
	}
}
