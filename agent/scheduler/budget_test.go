package scheduler

import (
	"math/rand"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

const mib = 1 << 20

func newBudgetFixture(t *testing.T, budget uint64, mode Mode) *queueFixture {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	q := newQueue(GPUConfig{UUID: "GPU-test", Quantum: 100 * time.Millisecond, Grace: 50 * time.Millisecond,
		Budget: budget, Mode: mode}, clock, m, logr.Discard())
	fx := &queueFixture{q: q, clock: clock, m: m}
	fx.checkViolations(t)
	return fx
}

func (fx *queueFixture) holding(f *fakeClient) bool {
	fx.q.mu.Lock()
	defer fx.q.mu.Unlock()
	return f.c.state.granted()
}

// whole: f holds the GPU with all it needs reserved (not, or no longer, filling in).
func (fx *queueFixture) whole(f *fakeClient) bool {
	fx.q.mu.Lock()
	defer fx.q.mu.Unlock()
	return f.c.state.granted() && f.c.state != stateFilling && f.c.reservation >= f.c.need
}

func (fx *queueFixture) reserved() uint64 {
	fx.q.mu.Lock()
	defer fx.q.mu.Unlock()
	return fx.q.reserved
}

// report sends what a shim would after its swap-in or a free: its real residency, acks up to date.
func (fx *queueFixture) report(f *fakeClient, reason uint32, need, resident uint64) {
	fx.q.mu.Lock()
	acks := f.c.raises
	fx.q.mu.Unlock()
	fx.q.usage(f.c, Message{Type: MsgUsage, Reason: reason, Acks: acks, Need: need, Resident: resident})
}

func TestBudgetWelcomeCarriesBudgetAndMode(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	a := fx.join(t, ClassOpportunistic)
	w, _ := a.last(MsgWelcome)
	if w.Budget != 64*mib || w.Mode != ModeAlways {
		t.Fatalf("welcome = %+v", w)
	}
}

func TestBudgetAutoRunsClientsThatFitTogetherConcurrently(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 30*mib)
	fx.q.acquire(b.c, 30*mib)
	if !fx.holding(a) || !fx.holding(b) {
		t.Fatal("clients whose working sets fit the budget together did not both run")
	}
	if a.count(MsgContended)+b.count(MsgContended) != 0 {
		t.Fatal("a holder was told to yield although everyone fits")
	}
	if g, _ := b.last(MsgGrant); g.Resident != 30*mib {
		t.Fatalf("grant reservation = %d, want the need", g.Resident)
	}
}

func TestBudgetAlwaysRunsOneClientAtATime(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 10*mib)
	fx.q.acquire(b.c, 10*mib)
	if !fx.holding(a) || fx.holding(b) {
		t.Fatal("Always let two clients run at once")
	}
	if a.count(MsgContended) != 1 {
		t.Fatal("the holder was not told that someone waits")
	}
	fx.q.release(a.c, grantEpoch(t, a), 10*mib)
	if !fx.holding(b) || b.count(MsgEvict)+a.count(MsgEvict) != 0 {
		t.Fatal("b did not run after a released, or something was evicted although both fit")
	}
}

// A version 2 client waits for the whole eviction before its grant (the hand-off in series).
func TestBudgetAutoSerializesWhenWorkingSetsDoNotFit(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	fx.version = MinVersion
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(b.c, 40*mib)
	if fx.holding(b) {
		t.Fatal("b runs although 80 MiB do not fit 64")
	}
	if a.count(MsgContended) != 1 {
		t.Fatal("the holder was not told to yield")
	}
	// a yields after its quantum, keeping its memory; b needs 16 MiB of it.
	fx.clock.Advance(100 * time.Millisecond)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	e, ok := a.last(MsgEvict)
	if !ok || e.Target != 24*mib {
		t.Fatalf("evict = %+v (%v), want a asked down to 24 MiB: only what b needs", e, ok)
	}
	if fx.holding(b) {
		t.Fatal("b granted before the eviction was done")
	}
	fx.report(a, UsageEvicted, 40*mib, 24*mib)
	if !fx.holding(b) {
		t.Fatal("b not granted after a evicted what it needs")
	}
	if r := fx.reserved(); r != 64*mib {
		t.Fatalf("reserved = %d MiB, want 64", r/mib)
	}
}

func TestBudgetEvictsTheLeastRecentlyRunFirst(t *testing.T) {
	fx := newBudgetFixture(t, 30*mib, ModeAlways)
	a, b, c := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	for _, f := range []*fakeClient{a, b} {
		fx.q.acquire(f.c, 10*mib)
		fx.report(f, UsageReport, 10*mib, 10*mib)
		fx.clock.Advance(time.Millisecond)
		fx.q.release(f.c, grantEpoch(t, f), 10*mib)
	}
	fx.q.acquire(c.c, 20*mib)
	if a.count(MsgEvict) != 1 || b.count(MsgEvict) != 0 {
		t.Fatalf("evictions a=%d b=%d; want only a, which ran longest ago", a.count(MsgEvict), b.count(MsgEvict))
	}
}

func TestBudgetMemReqGrowsInPlaceOrTellsTheHolderToYield(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 20*mib)
	fx.q.acquire(b.c, 20*mib)
	fx.q.memReq(a.c, 40*mib)
	if r, _ := a.last(MsgMemReply); r.Status != MemOK || r.Resident != 40*mib {
		t.Fatalf("growth that fits: %+v", r)
	}
	fx.q.memReq(a.c, 50*mib)
	if r, _ := a.last(MsgMemReply); r.Status != MemBusy {
		t.Fatalf("growth blocked by another holder: %+v, want Busy", r)
	}
	fx.q.memReq(a.c, 65*mib)
	if r, _ := a.last(MsgMemReply); r.Status != MemTooLarge {
		t.Fatalf("growth beyond the budget: %+v, want TooLarge", r)
	}
	if r := fx.reserved(); r > 64*mib {
		t.Fatalf("reserved %d MiB over the budget", r/mib)
	}
}

func TestBudgetOffNeverSerializesAndRefusesWhatDoesNotFit(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeOff)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 30*mib)
	fx.q.acquire(b.c, 30*mib)
	fx.q.memReq(a.c, 40*mib)
	if !fx.holding(a) || !fx.holding(b) {
		t.Fatal("Off serialized")
	}
	if r, _ := a.last(MsgMemReply); r.Status != MemTooLarge {
		t.Fatalf("Off growth that does not fit: %+v, want TooLarge (out of memory)", r)
	}
}

func TestBudgetIgnoresAReportWrittenBeforeARaise(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a := fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 10*mib)
	stale := a.c.raises
	fx.q.memReq(a.c, 30*mib) // raise sent; a report written before it arrives late
	fx.q.usage(a.c, Message{Type: MsgUsage, Acks: stale, Need: 10 * mib, Resident: 10 * mib})
	if r := fx.reserved(); r != 30*mib {
		t.Fatalf("a stale report lowered the reservation to %d MiB", r/mib)
	}
	fx.report(a, UsageReport, 8*mib, 8*mib)
	if r := fx.reserved(); r != 8*mib {
		t.Fatalf("a current report after frees left the reservation at %d MiB, want 8", r/mib)
	}
}

func TestBudgetHoldStartsWhenTheMemoryIsIn(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.q.acquire(b.c, 10*mib)
	fx.clock.Advance(140 * time.Millisecond) // a swaps in slowly, within quantum + grace: not revoked meanwhile
	if a.count(MsgRevoked) != 0 {
		t.Fatal("revoked while still swapping in")
	}
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.clock.Advance(149 * time.Millisecond)
	if a.count(MsgRevoked) != 0 {
		t.Fatal("revoked before quantum + grace counted from the swap-in")
	}
	fx.clock.Advance(time.Millisecond)
	if a.count(MsgRevoked) != 1 {
		t.Fatal("not revoked at quantum + grace after the swap-in")
	}
}

func TestBudgetADepartingClientReturnsItsMemory(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 60*mib)
	fx.q.acquire(b.c, 20*mib)
	fx.q.leave(a.c)
	if !fx.holding(b) || fx.reserved() != 20*mib {
		t.Fatalf("after the holder left: b holding=%v reserved=%d MiB", fx.holding(b), fx.reserved()/mib)
	}
}

// Random acquire / release / grow / evict answers / leave: the reservations
// never add up to more than the budget, and every waiter eventually runs.
func TestBudgetReservationsNeverExceedTheBudget(t *testing.T) {
	for _, mode := range []Mode{ModeAuto, ModeAlways, ModeOff} {
		t.Run(mode.String(), func(t *testing.T) {
			const budget = 64 * mib
			fx := newBudgetFixture(t, budget, mode)
			rng := rand.New(rand.NewSource(int64(mode) + 7))
			var cs []*fakeClient
			for range 6 {
				cs = append(cs, fx.join(t, Class(rng.Intn(2))))
			}
			for step := range 5000 {
				f := cs[rng.Intn(len(cs))]
				fx.q.mu.Lock()
				holding, waiting, evicting, res := f.c.state.granted(), f.c.state == stateWaiting, f.c.evictPending, f.c.reservation
				target := f.c.evictTarget
				fx.q.mu.Unlock()
				switch {
				case evicting:
					fx.report(f, UsageEvicted, res, target)
				case holding && rng.Intn(3) == 0:
					fx.q.memReq(f.c, uint64(1+rng.Intn(40))*mib)
				case holding:
					fx.report(f, UsageReport, res, res)
					fx.q.release(f.c, f.c.epoch, res)
				case !waiting:
					fx.q.acquire(f.c, uint64(1+rng.Intn(40))*mib)
				}
				fx.clock.Advance(time.Duration(rng.Intn(30)) * time.Millisecond)
				if r := fx.reserved(); r > budget {
					t.Fatalf("step %d: reserved %d MiB > budget", step, r/mib)
				}
			}
			if g := fx.q.gpuState(); g.PeakReservedBytes > budget || g.PeakReservedBytes == 0 {
				t.Fatalf("peak reserved = %d", g.PeakReservedBytes)
			}
		})
	}
}

func TestBudgetMetricsReportPerClientMemoryAndSwaps(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-m", SocketPath: "/nonexistent/m.sock", Budget: 64 * mib}},
		Registerer: reg, Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	q := s.queues[0]
	c := q.join(42, classSource{}, 0, func([]byte) bool { return true }, func() {})
	q.acquire(c, 8*mib)
	q.usage(c, Message{Type: MsgUsage, Acks: c.raises, Need: 8 * mib, Resident: 6 * mib,
		Stats: SwapStats{Swapped: 2 * mib, SwapOuts: 3, SwapIns: 4, BytesOut: 5, BytesIn: 7, SwapNS: 2e9}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "direction" {
					key += "/" + l.GetValue()
				}
			}
			switch {
			case m.GetGauge() != nil:
				got[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			}
		}
	}
	want := map[string]float64{
		"gpusharing_scheduler_budget_bytes":                64 * mib,
		"gpusharing_scheduler_reserved_bytes":              6 * mib, // lowered by the report
		"gpusharing_scheduler_client_resident_bytes":       6 * mib,
		"gpusharing_scheduler_client_swapped_bytes":        2 * mib,
		"gpusharing_scheduler_client_swaps_total/out":      3,
		"gpusharing_scheduler_client_swaps_total/in":       4,
		"gpusharing_scheduler_client_swap_bytes_total/out": 5,
		"gpusharing_scheduler_client_swap_bytes_total/in":  7,
		"gpusharing_scheduler_client_swap_seconds_total":   2,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	st := s.Snapshot()[0]
	if st.ResidentBytes != 6*mib || st.SwapOuts != 3 || st.SwapTime != 2*time.Second || st.ReservedBytes != 6*mib || st.NeedBytes != 8*mib {
		t.Errorf("snapshot = %+v", st)
	}
}

// A client granted the GPU for a growth reports right after its swap-in,
// before the allocation is made (resident 0, need = the growth). That report
// must not hand the growth's reservation back: on the H100 the waiter then
// got it, the grantee's allocation found the memory held (BUSY), it yielded,
// and so on every quantum, so it never ran until the other job ended.
func TestBudgetAReportBeforeTheGrowthKeepsItsReservation(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(b.c, 40*mib) // b's need is the growth it asks for; it has nothing yet
	fx.clock.Advance(100 * time.Millisecond)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	fx.report(a, UsageEvicted, 40*mib, 24*mib)
	if !fx.holding(b) {
		t.Fatal("b not granted after a's eviction")
	}
	fx.q.acquire(a.c, 40*mib) // a wants back in
	fx.report(b, UsageReport, 40*mib, 0)
	if fx.holding(a) {
		t.Fatal("b's report before its allocation gave its reservation to a")
	}
	fx.q.memReq(b.c, 40*mib)
	if r, _ := b.last(MsgMemReply); r.Status != MemOK {
		t.Fatalf("b's allocation after its grant: %+v, want OK", r)
	}
	fx.report(b, UsageReport, 40*mib, 40*mib)
	if r := fx.reserved(); r > 64*mib {
		t.Fatalf("reserved %d MiB over the budget", r/mib)
	}
}

// The two directions of a hand-off overlap: the newcomer is granted as soon as the eviction under way
// covers what it misses, with what is free then, and every progress report of the leaver raises its
// reservation by what was released, so it copies in while the leaver still copies out. The sum of
// the reservations never exceeds the budget; the quantum starts only when everything is in.
func TestBudgetHandOffOverlapsTheLeaversCopyOutWithTheNewcomersCopyIn(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(b.c, 40*mib)
	fx.clock.Advance(100 * time.Millisecond)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	if e, ok := a.last(MsgEvict); !ok || e.Target != 24*mib {
		t.Fatalf("evict = %+v (%v), want a asked down to 24 MiB", e, ok)
	}
	g, ok := b.last(MsgGrant)
	if !ok || !fx.holding(b) {
		t.Fatal("b is not granted while a's eviction is under way: the hand-off runs in series")
	}
	if g.Resident != 24*mib {
		t.Fatalf("b granted with a reservation of %d MiB, want the 24 MiB free now", g.Resident/mib)
	}
	// b's memory is not all in: a report now (acks of the grant only) must not start its quantum.
	steps := []struct{ resident, raisedTo uint64 }{{36 * mib, 28 * mib}, {30 * mib, 34 * mib}, {24 * mib, 40 * mib}}
	for i, st := range steps {
		reason := UsageProgress
		if i == len(steps)-1 {
			reason = UsageEvicted
		}
		fx.report(a, reason, 40*mib, st.resident)
		r, ok := b.last(MsgRaise)
		if !ok || r.Resident != st.raisedTo || r.Epoch != g.Epoch {
			t.Fatalf("after a reported %d MiB resident: raise = %+v (%v), want b raised to %d MiB", st.resident/mib,
				r, ok, st.raisedTo/mib)
		}
		if got := fx.reserved(); got > 64*mib {
			t.Fatalf("reserved %d MiB > budget 64", got/mib)
		}
	}
	if n := b.count(MsgRaise); n != 3 {
		t.Errorf("b got %d raises, want 3 (one per progress report)", n)
	}
	fx.q.mu.Lock()
	st := b.c.state
	fx.q.mu.Unlock()
	if st != stateStarting {
		t.Fatalf("after the last raise: b %v, want starting (done filling, the quantum not started)", st)
	}
	fx.report(b, UsageReport, 40*mib, 40*mib)
	fx.q.mu.Lock()
	st = b.c.state
	fx.q.mu.Unlock()
	if st != stateRunning {
		t.Fatal("b's report with everything in did not start its quantum")
	}
}

// A report written before a raise reached the client cannot lower its reservation, and a progress
// report after the eviction was answered is ignored.
func TestBudgetOverlappedHandOffKeepsTheAcksRule(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(b.c, 40*mib)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	fx.report(a, UsageProgress, 40*mib, 30*mib)
	fx.q.mu.Lock()
	acks := b.c.raises - 1 // b has not applied the raise yet
	fx.q.mu.Unlock()
	fx.q.usage(b.c, Message{Type: MsgUsage, Reason: UsageReport, Acks: acks, Need: 40 * mib, Resident: 24 * mib,
		Stats: SwapStats{Swapped: 16 * mib}})
	fx.q.mu.Lock()
	res := b.c.reservation
	fx.q.mu.Unlock()
	if res != 34*mib {
		t.Fatalf("b's reservation = %d MiB after a stale report, want the raised 34", res/mib)
	}
	fx.report(a, UsageEvicted, 40*mib, 24*mib)
	fx.report(a, UsageProgress, 40*mib, 10*mib) // late: the eviction is over
	fx.q.mu.Lock()
	resA := a.c.reservation
	fx.q.mu.Unlock()
	if resA != 24*mib {
		t.Fatalf("a's reservation = %d MiB after a late progress report, want 24", resA/mib)
	}
}

// handOffInSeries has a (40 of a 64 MiB budget, version 3) leave for b (40 MiB, joined as fx.version
// says) and checks that b waits while a copies out and gets its whole need in one Grant, without a
// Raise, once a is out; it returns that Grant.
func handOffInSeries(t *testing.T, fx *queueFixture, a *fakeClient, joinB func() *fakeClient) Message {
	t.Helper()
	b := joinB()
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.acquire(b.c, 40*mib)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	fx.report(a, UsageProgress, 40*mib, 30*mib)
	if fx.holding(b) || b.count(MsgRaise) != 0 {
		t.Fatal("b was granted while a still copied out: the hand-off overlapped")
	}
	fx.report(a, UsageEvicted, 40*mib, 24*mib)
	g, ok := b.last(MsgGrant)
	if !ok || g.Resident != 40*mib || b.count(MsgRaise) != 0 {
		t.Fatalf("grant = %+v (%v), raises %d: want the whole 40 MiB in one grant", g, ok, b.count(MsgRaise))
	}
	return g
}

// A version 2 client is never granted part of its need, nor sent a Raise, and its grant is a version 2 frame.
func TestBudgetVersion2ClientWaitsForTheWholeEviction(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	a := fx.join(t, ClassOpportunistic)
	g := handOffInSeries(t, fx, a, func() *fakeClient { fx.version = MinVersion; return fx.join(t, ClassOpportunistic) })
	if g.Version != MinVersion {
		t.Fatalf("grant in a version %d frame, want %d", g.Version, MinVersion)
	}
}

// With SerialHandoffs a version 3 client too waits for the whole eviction (each direction of the swap
// runs alone).
func TestBudgetSerialHandoffsGrantOnlyOnceTheLeaverIsOut(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAlways)
	fx.q.serial = true
	a := fx.join(t, ClassOpportunistic)
	handOffInSeries(t, fx, a, func() *fakeClient { return fx.join(t, ClassOpportunistic) })
}

// A holder filling in holds up the others only while what it misses is on its way: once an eviction
// gave up part way and nobody else can give the rest, the next waiter is served (the filling holder's
// swap-in gives its grant back after its own timeout).
func TestBudgetFillingHolderDoesNotBlockOthersWhenNothingMoreComes(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b, c := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	fx.q.acquire(b.c, 40*mib)
	if !fx.holding(b) || fx.whole(b) {
		t.Fatal("b is not filling in while a's eviction runs")
	}
	fx.q.acquire(c.c, 0) // a lock-only client: it needs no memory
	if fx.holding(c) {
		t.Fatal("c granted while the memory b misses is on its way")
	}
	fx.report(a, UsageEvicted, 40*mib, 40*mib) // a could not copy anything out
	if !fx.holding(c) {
		t.Fatal("c still waits although nothing more will come to b")
	}
	if fx.whole(b) {
		t.Fatal("b got memory nobody freed")
	}
}

// A filling holder whose report says it needs less than it has reserved keeps what the report
// leaves it and is raised no further: freed budget goes to others. Before the fix the filling
// computed need - reservation unsigned and handed it the free budget, beyond its need.
func TestFillingHolderWhoseNeedDropsBelowItsReservationIsNotRaised(t *testing.T) {
	fx := newBudgetFixture(t, 64*mib, ModeAuto)
	a, b := fx.join(t, ClassOpportunistic), fx.join(t, ClassOpportunistic)
	fx.q.acquire(a.c, 40*mib)
	fx.report(a, UsageReport, 40*mib, 40*mib)
	fx.q.release(a.c, grantEpoch(t, a), 40*mib)
	fx.q.acquire(b.c, 40*mib) // granted the free 24 MiB, fills while a is evicted to 24
	fx.q.mu.Lock()
	st, res := b.c.state, b.c.reservation
	fx.q.mu.Unlock()
	if st != stateFilling || res != 24*mib {
		t.Fatalf("b %v with %d MiB reserved, want filling with 24", st, res/mib)
	}
	fx.report(b, UsageReport, 10*mib, 20*mib) // it freed memory: 10 MiB needed, 20 still resident
	fx.q.mu.Lock()
	st, res, need := b.c.state, b.c.reservation, b.c.need
	fx.q.mu.Unlock()
	if st != stateStarting || res != 20*mib || need != 10*mib || b.count(MsgRaise) != 0 {
		t.Fatalf("after b's report: %v, reservation %d MiB, need %d MiB, %d raises; want starting, 20, 10, 0",
			st, res/mib, need/mib, b.count(MsgRaise))
	}
	m, _ := a.last(MsgEvict)
	fx.report(a, UsageEvicted, 40*mib, m.Target)
	if got := b.count(MsgRaise); got != 0 || fx.reserved() != 20*mib+m.Target {
		t.Fatalf("after a's eviction: b raised %d times, reserved %d MiB; want 0 and b's 20 + a's %d",
			got, fx.reserved()/mib, m.Target/mib)
	}
}
