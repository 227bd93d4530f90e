// Package health watches NVML health events and keeps each GPU's health for the agent's status, the way
// NVIDIA's k8s-device-plugin does: one NVML event set with every GPU's critical-Xid (and ECC) events
// registered, a goroutine that waits on it, application Xids ignored, and a GPU with any other critical
// Xid unhealthy until the agent restarts. See docs/health.md.
package health

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Reasons a GPU's Health carries; ReasonXidError and ReasonGPULost are meant for the GPU's Healthy
// condition (False), the others for its message.
const (
	// ReasonXidError: the GPU reported a critical Xid that is not ignored (Healthy false).
	ReasonXidError = v1alpha1.ReasonXidError
	// ReasonGPULost: NVML said the GPU is lost while its events were registered (Healthy false).
	ReasonGPULost = v1alpha1.ReasonGPULost
	// ReasonWatched: the GPU's Xid events are watched and none was critical (Healthy true). What to do:
	// nothing.
	ReasonWatched = "XidEventsWatched"
	// ReasonNotMonitored: the GPU's events could not be registered (too old a GPU: NVML's
	// NOT_SUPPORTED, or another NVML error in the message); its health is not monitored (Healthy true).
	// What to do: nothing on a GPU too old for Xid events; for another NVML error, check the node's
	// driver (nvidia-smi) and restart the agent.
	ReasonNotMonitored = "HealthNotMonitored"
)

// Health is one GPU's health as the watcher knows it.
type Health struct {
	// Healthy is false once the GPU reported a critical Xid (or was lost); it stays false until the
	// agent restarts.
	Healthy bool
	// Monitored is whether the GPU's events are watched.
	Monitored bool
	// Reason is one of the Reason constants.
	Reason string
	// Message says what happened: "Xid 79: GPU has fallen off the bus at 2026-11-22T10:05:00Z".
	Message string
	// Since is when the GPU got this health.
	Since time.Time
}

// Source is what the watcher needs of the GPUs: *gpu.NVML and gpu.Null satisfy it.
type Source interface {
	// HealthEvents creates an event set with every GPU's health events registered.
	HealthEvents() (gpu.EventSet, []gpu.Registration, error)
}

var (
	_ Source = (*gpu.NVML)(nil)
	_ Source = gpu.Null{}
)

// Defaults of Config.
const (
	DefaultWaitTimeout = 5 * time.Second
	DefaultBackoff     = time.Second
	DefaultBackoffMax  = time.Minute
)

// Config configures a Watcher.
type Config struct {
	// Source is the GPUs.
	Source Source
	// Disabled turns health checks off: Run registers nothing and Snapshot is empty.
	Disabled bool
	// IgnoredXids are the Xids that leave a GPU healthy; nil means DefaultIgnoredXids (an empty,
	// non-nil list ignores none).
	IgnoredXids []uint64
	// Notify, when set, is called with a GPU's uuid when its health needs publishing: it became unhealthy,
	// or it is not monitored (once, at start). It must not block.
	Notify func(uuid string)
	// WaitTimeout bounds one NVML wait, so a cancelled context is noticed (default DefaultWaitTimeout).
	WaitTimeout time.Duration
	// Backoff and BackoffMax bound the wait after a failed NVML wait (or event set creation), doubling
	// per consecutive failure (defaults DefaultBackoff, DefaultBackoffMax).
	Backoff, BackoffMax time.Duration
	// Clock is the clock of backoffs and timestamps (default the real clock).
	Clock clock.Clock
}

// Watcher keeps each GPU's health from NVML events. Run it once; read it with Snapshot.
type Watcher struct {
	cfg     Config
	ignored map[uint64]bool
	ready   chan struct{}

	mu   sync.Mutex
	gpus map[string]Health
	// instances are the MIG instances marked alone, by GPU uuid and GPU instance id (instances.go).
	instances map[string]map[int]Health
	// scoped says whether a GPU instance's critical Xid marks that instance alone (ScopeInstances).
	scoped func(gpuUUID string, giID int) bool
}

// New returns a watcher; Run starts it.
func New(cfg Config) *Watcher {
	if cfg.IgnoredXids == nil {
		cfg.IgnoredXids = DefaultIgnoredXids
	}
	if cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.BackoffMax < cfg.Backoff {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.Backoff)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	w := &Watcher{cfg: cfg, ignored: map[uint64]bool{}, ready: make(chan struct{}), gpus: map[string]Health{}}
	for _, x := range cfg.IgnoredXids {
		w.ignored[x] = true
	}
	return w
}

// Snapshot returns each GPU's health by uuid. A GPU it does not list (health checks disabled, no NVML,
// a GPU NVML could not name) has no health information: treat it as healthy.
func (w *Watcher) Snapshot() map[string]Health {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]Health, len(w.gpus))
	for u, h := range w.gpus {
		out[u] = h
	}
	return out
}

// Get returns one GPU's health and whether the watcher knows the GPU.
func (w *Watcher) Get(uuid string) (Health, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.gpus[uuid]
	return h, ok
}

// Ready is closed once Run has registered the GPUs (or found nothing to watch).
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run watches until ctx is cancelled, then frees the event set. It never fails: what it cannot watch
// is reported in Snapshot and logged, and NVML errors are retried with backoff. Its error is always nil
// (a controller-runtime Runnable stops the manager on an error).
func (w *Watcher) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("health")
	ctx = logr.NewContext(ctx, log)
	if w.cfg.Disabled {
		log.Info("GPU health checks are disabled")
		close(w.ready)
		<-ctx.Done()
		return nil
	}
	set := w.start(ctx)
	if set == nil {
		return nil
	}
	defer func() {
		if err := set.Free(); err != nil {
			log.Error(err, "Could not free the NVML event set of GPU health events")
		}
	}()
	w.watch(ctx, set)
	return nil
}

// start creates the event set, retrying with backoff; nil when ctx ended or there is no NVML.
func (w *Watcher) start(ctx context.Context) gpu.EventSet {
	log := logr.FromContextOrDiscard(ctx)
	backoff := time.Duration(0)
	for {
		set, regs, err := w.cfg.Source.HealthEvents()
		if err == nil {
			w.registered(ctx, regs)
			close(w.ready)
			return set
		}
		if errors.Is(err, gpu.ErrUnavailable) {
			log.Info("GPU health is not monitored: NVML is unavailable", "error", err.Error())
			close(w.ready)
			<-ctx.Done()
			return nil
		}
		backoff = w.next(backoff)
		log.Error(err, "Could not create the NVML event set of GPU health events; retrying", "backoff", backoff)
		if !w.sleep(ctx, backoff) {
			close(w.ready)
			return nil
		}
	}
}

func (w *Watcher) registered(ctx context.Context, regs []gpu.Registration) {
	log := logr.FromContextOrDiscard(ctx)
	now := w.now()
	var notify []string
	w.mu.Lock()
	for _, r := range regs {
		if r.UUID == "" {
			log.Error(r.Err, "GPU health is not monitored: NVML could not name the GPU", "index", r.Index)
			continue
		}
		var h Health
		switch {
		case r.Err == nil:
			kinds := make([]string, len(r.Kinds))
			for i, k := range r.Kinds {
				kinds[i] = string(k)
			}
			h = Health{Healthy: true, Monitored: true, Reason: ReasonWatched,
				Message: "NVML events watched: " + strings.Join(kinds, ", ")}
			log.Info("Watching GPU health events", "gpu", r.UUID, "index", r.Index, "events", kinds)
		case errors.Is(r.Err, gpu.ErrGPULost):
			h = Health{Healthy: false, Reason: ReasonGPULost, Message: fmt.Sprintf("registering its health events at %s: %v", stamp(now), r.Err)}
			log.Info("GPU is lost", "gpu", r.UUID, "index", r.Index, "error", r.Err.Error())
			notify = append(notify, r.UUID)
		case errors.Is(r.Err, gpu.ErrEventsNotSupported):
			h = Health{Healthy: true, Reason: ReasonNotMonitored, Message: "health not monitored: the GPU reports no Xid events"}
			log.Info("GPU health is not monitored: the GPU reports no Xid events", "gpu", r.UUID, "index", r.Index, "error", r.Err.Error())
			notify = append(notify, r.UUID)
		default:
			h = Health{Healthy: true, Reason: ReasonNotMonitored, Message: fmt.Sprintf("health not monitored: registering its Xid events failed: %v", r.Err)}
			log.Error(r.Err, "GPU health is not monitored: registering its Xid events failed", "gpu", r.UUID, "index", r.Index)
			notify = append(notify, r.UUID)
		}
		h.Since = now
		w.gpus[r.UUID] = h
	}
	w.mu.Unlock()
	w.notify(notify...)
}

func (w *Watcher) watch(ctx context.Context, set gpu.EventSet) {
	log := logr.FromContextOrDiscard(ctx)
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		ev, err := set.Wait(w.cfg.WaitTimeout)
		switch {
		case errors.Is(err, gpu.ErrEventTimeout):
			backoff = 0
		case err != nil:
			backoff = w.next(backoff)
			log.Error(err, "Waiting for GPU health events failed; retrying", "backoff", backoff)
			w.sleep(ctx, backoff)
		default:
			backoff = 0
			w.handle(ctx, ev)
		}
	}
}

func (w *Watcher) handle(ctx context.Context, ev gpu.Event) {
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", ev.UUID)
	if ev.GIID != gpu.NoInstance {
		log = log.WithValues("gpuInstance", ev.GIID, "computeInstance", ev.CIID)
	}
	if ev.Kind != gpu.EventXid {
		// As the device plugin: ECC events are registered but only logged; an uncorrectable error also
		// raises its Xid (48, 94, 95), which is what marks the GPU.
		log.Info("GPU reported an ECC event; an uncorrectable error also raises an Xid", "event", string(ev.Kind), "data", ev.Data)
		return
	}
	xid := ev.Data
	if w.ignored[xid] {
		log.Info("Ignoring an application Xid of the GPU", "xid", xid, "description", XidDescription(xid))
		return
	}
	now := w.now()
	msg := fmt.Sprintf("Xid %d", xid)
	if d := XidDescription(xid); d != "" {
		msg += ": " + d
	}
	msg += " at " + stamp(now)
	if ev.GIID != gpu.NoInstance && w.markInstance(ev, msg, now) {
		log.Info("A MIG instance created for a claim reported a critical Xid; marking that instance alone", "xid", xid, "description", XidDescription(xid))
		w.notify(ev.UUID)
		return
	}
	if ev.GIID != gpu.NoInstance {
		msg += fmt.Sprintf(" (MIG GPU instance %d, compute instance %d; the whole GPU is marked)", ev.GIID, ev.CIID)
	}

	var marked []string
	w.mu.Lock()
	if _, known := w.gpus[ev.UUID]; ev.UUID != "" && !known {
		w.mu.Unlock()
		log.Info("Ignoring an Xid of a GPU whose events were not registered", "xid", xid)
		return
	}
	targets := []string{ev.UUID}
	if ev.UUID == "" {
		// As the device plugin: a critical Xid NVML cannot place marks every GPU.
		msg += " on a GPU NVML could not name; every GPU is marked"
		targets = targets[:0]
		for u := range w.gpus {
			targets = append(targets, u)
		}
	}
	for _, u := range targets {
		if h := w.gpus[u]; !h.Healthy {
			continue // the first critical error stays
		}
		w.gpus[u] = Health{Healthy: false, Monitored: w.gpus[u].Monitored, Reason: ReasonXidError, Message: msg, Since: now}
		marked = append(marked, u)
	}
	w.mu.Unlock()
	if len(marked) == 0 {
		log.Info("GPU reported another critical Xid; it is already unhealthy", "xid", xid, "description", XidDescription(xid))
		return
	}
	log.Info("GPU reported a critical Xid; marking it unhealthy", "xid", xid, "description", XidDescription(xid), "marked", marked)
	w.notify(marked...)
}

func (w *Watcher) notify(uuids ...string) {
	if w.cfg.Notify == nil {
		return
	}
	for _, u := range uuids {
		w.cfg.Notify(u)
	}
}

// next doubles the backoff within its bounds.
func (w *Watcher) next(d time.Duration) time.Duration {
	if d == 0 {
		return w.cfg.Backoff
	}
	return min(2*d, w.cfg.BackoffMax)
}

// sleep waits d on the clock; false when ctx ended first.
func (w *Watcher) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-w.cfg.Clock.After(d):
		return true
	}
}

func (w *Watcher) now() time.Time { return w.cfg.Clock.Now().UTC().Truncate(time.Second) }

func stamp(t time.Time) string { return t.Format(time.RFC3339) }
