package health_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/test/wait"
)

var t0 = time.Date(2026, 11, 22, 10, 5, 0, 0, time.UTC)

// fixture runs a watcher over a mock DGX A100 with an event queue and a fake clock.
type fixture struct {
	t       *testing.T
	server  *nvmlmock.Server
	events  *nvmlmock.Events
	clock   *clocktesting.FakeClock
	w       *health.Watcher
	cancel  context.CancelFunc
	done    chan struct{}
	notices chan string

	mu       sync.Mutex
	notified []string
}

// newFixture builds the mock; setup may configure its events before the watcher starts.
func newFixture(t *testing.T, gpus int, cfg health.Config, setup func(*nvmlmock.Events)) *fixture {
	t.Helper()
	f := &fixture{t: t, server: nvmlmock.NewA100(gpus), clock: clocktesting.NewFakeClock(t0), done: make(chan struct{}), notices: make(chan string, 100)}
	f.events = nvmlmock.NewEvents(f.server)
	if setup != nil {
		setup(f.events)
	}
	cfg.Source = gpu.NewNVML(f.server)
	cfg.Clock = f.clock
	cfg.WaitTimeout = 5 * time.Millisecond
	cfg.Notify = func(uuid string) {
		f.mu.Lock()
		f.notified = append(f.notified, uuid)
		f.mu.Unlock()
		f.notices <- uuid
	}
	f.w = health.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() {
		defer close(f.done)
		if err := f.w.Run(ctx); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	}()
	t.Cleanup(f.stop)
	select {
	case <-f.w.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher did not register the GPUs within 5s")
	}
	return f
}

func (f *fixture) stop() {
	f.cancel()
	select {
	case <-f.done:
	case <-time.After(5 * time.Second):
		f.t.Fatal("Run did not return within 5s of the cancel")
	}
}

func (f *fixture) uuid(i int) string { return f.server.GPUs[i].UUID }

// awaitNotice waits for the next notification and checks it names the GPU.
func (f *fixture) awaitNotice(i int) {
	f.t.Helper()
	select {
	case u := <-f.notices:
		if u != f.uuid(i) {
			f.t.Fatalf("notified %s, want GPU %d (%s)", u, i, f.uuid(i))
		}
	case <-time.After(5 * time.Second):
		f.t.Fatalf("no notification for GPU %d within 5s", i)
	}
}

func (f *fixture) notifications() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.notified...)
}

func (f *fixture) pushXid(i int, xid uint64) {
	f.t.Helper()
	if n := f.events.PushXid(i, xid); n != 1 {
		f.t.Fatalf("Xid %d of GPU %d reached %d event sets, want 1", xid, i, n)
	}
}

func (f *fixture) health(i int) health.Health {
	f.t.Helper()
	h, ok := f.w.Snapshot()[f.uuid(i)]
	if !ok {
		f.t.Fatalf("snapshot has no GPU %d", i)
	}
	return h
}

func watched() health.Health {
	return health.Health{Healthy: true, Monitored: true, Reason: health.ReasonWatched,
		Message: "NVML events watched: Xid, DoubleBitECC, SingleBitECC", Since: t0}
}

func TestCriticalXidMarksTheGPUUnhealthyWithTheXidAndNotifiesOnce(t *testing.T) {
	f := newFixture(t, 2, health.Config{}, nil)
	if got := f.health(1); got != watched() {
		t.Fatalf("GPU 1 before any event = %+v, want %+v", got, watched())
	}
	f.clock.SetTime(t0.Add(90 * time.Second))
	f.pushXid(1, 79)
	f.awaitNotice(1)

	want := health.Health{Healthy: false, Monitored: true, Reason: health.ReasonXidError,
		Message: "Xid 79: GPU has fallen off the bus at 2026-11-22T10:06:30Z", Since: t0.Add(90 * time.Second)}
	if got := f.health(1); got != want {
		t.Errorf("GPU 1 = %+v, want %+v", got, want)
	}
	if got := f.health(0); got != watched() {
		t.Errorf("GPU 0 = %+v, want still watched and healthy", got)
	}

	// More critical Xids on the unhealthy GPU change nothing and notify nobody; events are handled in
	// order, so once GPU 0's notice arrives they have been seen.
	f.clock.SetTime(t0.Add(5 * time.Minute))
	f.pushXid(1, 79)
	f.pushXid(1, 48)
	f.pushXid(0, 200)
	f.awaitNotice(0)
	if got := f.health(1); got != want {
		t.Errorf("GPU 1 after more Xids = %+v, want the first one kept: %+v", got, want)
	}
	if got, want := f.notifications(), []string{f.uuid(1), f.uuid(0)}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("notifications = %v, want %v (one per GPU)", got, want)
	}
	if got := f.health(0).Message; got != "Xid 200 at 2026-11-22T10:10:00Z" {
		t.Errorf("GPU 0 message = %q, want an unknown Xid by number only", got)
	}
}

func TestXidsThatLeaveTheGPUHealthy(t *testing.T) {
	tests := []struct {
		name    string
		ignored []uint64
		push    func(*nvmlmock.Events)
		healthy bool
	}{
		{name: "application Xid 13 by default", push: func(e *nvmlmock.Events) { e.PushXid(0, 13) }, healthy: true},
		{name: "application Xid 109 by default", push: func(e *nvmlmock.Events) { e.PushXid(0, 109) }, healthy: true},
		{name: "a double-bit ECC event alone (its Xid marks the GPU)", push: func(e *nvmlmock.Events) { e.Push(0, nvml.EventTypeDoubleBitEccError, 0, 0xFFFFFFFF, 0xFFFFFFFF) }, healthy: true},
		{name: "Xid 79 when configured as ignored", ignored: []uint64{79}, push: func(e *nvmlmock.Events) { e.PushXid(0, 79) }, healthy: true},
		{name: "Xid 13 when the ignored list is empty", ignored: []uint64{}, push: func(e *nvmlmock.Events) { e.PushXid(0, 13) }, healthy: false},
		{name: "Xid 48 by default", push: func(e *nvmlmock.Events) { e.PushXid(0, 48) }, healthy: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, 2, health.Config{IgnoredXids: tt.ignored}, nil)
			tt.push(f.events)
			// GPU 1's critical Xid comes after, so once it is noticed GPU 0's event has been handled.
			f.pushXid(1, 62)
			if !tt.healthy {
				f.awaitNotice(0)
			}
			f.awaitNotice(1)
			if got := f.health(0); got.Healthy != tt.healthy || got.Monitored != true {
				t.Errorf("GPU 0 = %+v, want healthy=%v", got, tt.healthy)
			}
		})
	}
}

func TestMIGXidMarksTheWholeParentGPU(t *testing.T) {
	f := newFixture(t, 2, health.Config{}, nil)
	if n := f.events.Push(0, nvml.EventTypeXidCriticalError, 94, 3, 0); n != 1 {
		t.Fatalf("event reached %d sets", n)
	}
	f.awaitNotice(0)
	want := "Xid 94: Contained ECC error at 2026-11-22T10:05:00Z (MIG GPU instance 3, compute instance 0; the whole GPU is marked)"
	if got := f.health(0); got.Healthy || got.Reason != health.ReasonXidError || got.Message != want {
		t.Errorf("GPU 0 = %+v, want unhealthy XidError %q", got, want)
	}
}

func TestGPUWhoseRegistrationFailsIsNotMonitoredWhileOthersAreWatched(t *testing.T) {
	f := newFixture(t, 4, health.Config{}, func(e *nvmlmock.Events) {
		e.FailRegisterEvents(1, nvml.ERROR_NOT_SUPPORTED)
		e.FailRegisterEvents(2, nvml.ERROR_UNKNOWN)
		e.FailRegisterEvents(3, nvml.ERROR_GPU_IS_LOST)
	})
	// Each GPU not watched is published at start.
	for _, i := range []int{1, 2, 3} {
		f.awaitNotice(i)
	}
	if got, want := f.health(1), (health.Health{Healthy: true, Monitored: false, Reason: health.ReasonNotMonitored,
		Message: "health not monitored: the GPU reports no Xid events", Since: t0}); got != want {
		t.Errorf("GPU 1 (NOT_SUPPORTED) = %+v, want %+v", got, want)
	}
	if got := f.health(2); !got.Healthy || got.Monitored || got.Reason != health.ReasonNotMonitored || !strings.Contains(got.Message, "RegisterEvents(Xid,DoubleBitECC,SingleBitECC): ") {
		t.Errorf("GPU 2 (ERROR_UNKNOWN) = %+v, want healthy, not monitored, NVML's error in the message", got)
	}
	if got := f.health(3); got.Healthy || got.Reason != health.ReasonGPULost {
		t.Errorf("GPU 3 (GPU_IS_LOST) = %+v, want unhealthy GPULost", got)
	}
	if n := f.events.PushXid(1, 79); n != 0 {
		t.Errorf("an Xid of the unregistered GPU reached %d sets, want 0", n)
	}
	f.pushXid(0, 79)
	f.awaitNotice(0)
	if got := f.health(0); got.Healthy || got.Reason != health.ReasonXidError {
		t.Errorf("GPU 0 = %+v, want unhealthy: it is still watched", got)
	}
}

func TestCancelStopsTheWatcherAndFreesTheEventSetOnce(t *testing.T) {
	f := newFixture(t, 2, health.Config{}, nil)
	sets := f.events.Sets()
	if len(sets) != 1 {
		t.Fatalf("event sets = %d, want 1", len(sets))
	}
	if sets[0].Freed() != 0 {
		t.Fatal("the event set was freed while the watcher runs")
	}
	f.stop()
	if got := sets[0].Freed(); got != 1 {
		t.Errorf("Free called %d times, want 1", got)
	}
	if got := sets[0].WaitsAfterFree(); got != 0 {
		t.Errorf("Wait called %d times after Free, want 0", got)
	}
}

func TestWaitErrorIsRetriedWithDoublingBackoff(t *testing.T) {
	f := newFixture(t, 1, health.Config{Backoff: time.Second, BackoffMax: 3 * time.Second}, func(e *nvmlmock.Events) {
		e.FailWait(nvml.ERROR_UNKNOWN, nvml.ERROR_UNKNOWN, nvml.ERROR_UNKNOWN, nvml.ERROR_UNKNOWN)
	})
	set := f.events.Sets()[0]
	// After each failure the watcher sleeps on the clock and calls Wait again only when the backoff passed:
	// 1s, 2s, then 3s (the bound) twice.
	for n, backoff := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		wait.Until(t, 5*time.Second, func() bool { return f.clock.HasWaiters() }, "the watcher to sleep after failed wait %d", n+1)
		if got := set.Waits(); got != n+1 {
			t.Fatalf("waits = %d after failure %d, want %d", got, n+1, n+1)
		}
		f.clock.Step(backoff - time.Millisecond)
		// Asleep on the clock again: had the step fired its timer, the watcher would have called Wait
		// (counted below) before it slept again.
		wait.Until(t, 5*time.Second, func() bool { return f.clock.HasWaiters() }, "the watcher asleep after a %v step", backoff-time.Millisecond)
		if got := set.Waits(); got != n+1 {
			t.Fatalf("waits = %d %v into a %v backoff, want %d (no retry before it passed)", got, backoff-time.Millisecond, backoff, n+1)
		}
		f.clock.Step(time.Millisecond)
		wait.Until(t, 5*time.Second, func() bool { return set.Waits() > n+1 }, "a retry after the %v backoff", backoff)
	}
	// Recovered: events are handled again.
	f.pushXid(0, 79)
	f.awaitNotice(0)
	if f.health(0).Healthy {
		t.Error("GPU 0 still healthy after Xid 79 once waiting recovered")
	}
	if f.w.Snapshot()[f.uuid(0)].Reason != health.ReasonXidError {
		t.Errorf("GPU 0 = %+v", f.health(0))
	}
}

func TestEventSetCreationIsRetriedWithBackoff(t *testing.T) {
	s := nvmlmock.NewA100(1)
	ev := nvmlmock.NewEvents(s)
	ev.FailEventSetCreate(nvml.ERROR_UNKNOWN)
	clk := clocktesting.NewFakeClock(t0)
	w := health.New(health.Config{Source: gpu.NewNVML(s), Clock: clk, WaitTimeout: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	wait.Until(t, 5*time.Second, clk.HasWaiters, "the watcher to sleep after the failed EventSetCreate")
	select {
	case <-w.Ready():
		t.Fatal("ready before any event set exists")
	default:
	}
	clk.Step(health.DefaultBackoff)
	select {
	case <-w.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("not ready within 5s of the backoff")
	}
	if h, ok := w.Get(s.GPUs[0].UUID); !ok || !h.Monitored {
		t.Errorf("GPU 0 = %+v, %v; want watched after the retry", h, ok)
	}
	if n := len(ev.Sets()); n != 1 {
		t.Errorf("event sets = %d, want 1", n)
	}
}

func TestDisabledHealthChecksRegisterNothing(t *testing.T) {
	f := newFixture(t, 2, health.Config{Disabled: true}, nil)
	if n := len(f.events.Sets()); n != 0 {
		t.Errorf("event sets created = %d, want 0", n)
	}
	if s := f.w.Snapshot(); len(s) != 0 {
		t.Errorf("snapshot = %+v, want empty", s)
	}
}

func TestNoNVMLMeansNothingToWatch(t *testing.T) {
	w := health.New(health.Config{Source: gpu.Null{}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	select {
	case <-w.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("not ready within 5s")
	}
	if s := w.Snapshot(); len(s) != 0 {
		t.Errorf("snapshot = %+v, want empty", s)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the cancel")
	}
}

func TestParseXids(t *testing.T) {
	got, err := health.ParseXids(" 13,31 ,,109")
	if err != nil || health.FormatXids(got) != "13,31,109" {
		t.Errorf("ParseXids = %v, %v; want 13,31,109", got, err)
	}
	if got, err := health.ParseXids(""); err != nil || len(got) != 0 {
		t.Errorf("ParseXids(\"\") = %v, %v; want empty", got, err)
	}
	if _, err := health.ParseXids("13,x"); err == nil {
		t.Error("ParseXids accepted 'x'")
	}
	if got := health.FormatXids(health.DefaultIgnoredXids); got != "13,31,43,45,68,109" {
		t.Errorf("defaults = %s", got)
	}
}

func TestAClaimsMIGInstanceXidMarksThatInstanceAlone(t *testing.T) {
	f := newFixture(t, 2, health.Config{}, nil)
	f.w.ScopeInstances(func(gpu string, gi int) bool { return gpu == f.uuid(0) && gi == 3 })
	if n := f.events.Push(0, nvml.EventTypeXidCriticalError, 94, 3, 0); n != 1 {
		t.Fatalf("event reached %d sets", n)
	}
	f.awaitNotice(0)
	if got := f.health(0); got != watched() {
		t.Errorf("GPU 0 = %+v, want still healthy: only the claim's instance is marked", got)
	}
	want := "Xid 94: Contained ECC error at 2026-11-22T10:05:00Z (MIG GPU instance 3, compute instance 0, created for a claim; only this instance is marked)"
	if got := f.w.Instances(f.uuid(0)); len(got) != 1 || got[3].Healthy || got[3].Message != want {
		t.Errorf("instances of GPU 0 = %+v, want GI 3 unhealthy with %q", got, want)
	}
	// An instance that is no claim's (a fixed layout's) marks the whole GPU, as before.
	if n := f.events.Push(0, nvml.EventTypeXidCriticalError, 94, 5, 0); n != 1 {
		t.Fatalf("event reached %d sets", n)
	}
	f.awaitNotice(0)
	if got := f.health(0); got.Healthy {
		t.Errorf("GPU 0 after an Xid on a fixed instance = %+v, want unhealthy", got)
	}
	f.w.ForgetInstance(f.uuid(0), 3)
	if got := f.w.Instances(f.uuid(0)); len(got) != 0 {
		t.Errorf("instances after the claim's instance is destroyed = %+v", got)
	}
}
