package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/drain"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// DevicePlugin is the part of deviceplugin.Manager the reconciler uses: it is told every status a pass
// computes, and hides a GPU while it is drained.
type DevicePlugin interface {
	UpdateFromStatus(ctx context.Context, status v1alpha1.GPUNodeStatus) error
	Cordon(ctx context.Context, gpuUUID string) error
	Uncordon(ctx context.Context, gpuUUID string) error
}

// Drainer empties one GPU of its pods; drain.Drainer implements it.
type Drainer interface {
	Drain(ctx context.Context, req drain.Request) (drain.Result, error)
}

const (
	// DefaultDrainTimeout bounds a drain whose spec entry names no timeout (the CRD defaults it too).
	DefaultDrainTimeout = 10 * time.Minute
	// DefaultDrainBackoff is how long a GPU whose drain (or the change after it) failed waits before the
	// agent drains it again for the same desired sharing; it doubles per consecutive failure.
	DefaultDrainBackoff = 5 * time.Minute
	// DefaultDrainBackoffMax caps that wait.
	DefaultDrainBackoffMax = time.Hour
)

// gpuDrain is one GPU's drain for one desired sharing: running on its own goroutine, or ended badly and
// waiting for its retry time. It lives in memory only: an agent that restarts mid-drain has no GPU
// cordoned (its device plugin starts afresh) and simply starts the drain again.
type gpuDrain struct {
	// key is what the drain is for: the desired sharing and the drain settings. Another key means the
	// spec changed, which ends this drain and its backoff.
	key     string
	target  string
	mode    v1alpha1.DrainMode
	timeout time.Duration
	started time.Time
	cancel  context.CancelFunc
	// cordoned says the device plugin hides the GPU for this drain.
	cordoned bool
	// failures counts consecutive failed drains (or changes after a drain) for this key.
	failures int

	// Written by the drain's goroutine.
	listed  bool
	pods    []string
	message string
	done    bool
	err     error

	// Set by the pass that sees the drain (or the change after it) fail: the error the GPU reports
	// until retryAt.
	failErr error
	retryAt time.Time
}

// drains holds every GPU's drain; passes and drain goroutines share it under mu.
type drains struct {
	mu    sync.Mutex
	base  context.Context
	byGPU map[string]*gpuDrain
}

func (ds *drains) get(uuid string) *gpuDrain {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.byGPU[uuid]
}

// remove stops the GPU's drain, if any, and returns it.
func (ds *drains) remove(uuid string) *gpuDrain {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	d := ds.byGPU[uuid]
	if d != nil {
		d.cancel()
		delete(ds.byGPU, uuid)
	}
	return d
}

// uuids lists the GPUs with a drain.
func (ds *drains) uuids() []string {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return slices.Sorted(maps.Keys(ds.byGPU))
}

// nextRetry is the earliest retry time of a failed drain; zero when none waits.
func (ds *drains) nextRetry() time.Time {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	var next time.Time
	for _, d := range ds.byGPU {
		if !d.retryAt.IsZero() && (next.IsZero() || d.retryAt.Before(next)) {
			next = d.retryAt
		}
	}
	return next
}

// run keeps the drains' base context for the manager's lifetime and stops every drain when it ends.
func (ds *drains) run(ctx context.Context) error {
	ds.mu.Lock()
	ds.base = ctx
	ds.mu.Unlock()
	<-ctx.Done()
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for _, d := range ds.byGPU {
		d.cancel()
	}
	return nil
}

func (r *Reconciler) drainOn() bool { return r.Devices != nil && r.Drainer != nil }

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) notify() {
	if r.Notify != nil {
		r.Notify()
	}
}

// drainKey identifies what a drain is for; a different key is a spec change.
func drainKey(want v1alpha1.GPUDesired) string {
	mode, timeout := drainSettings(want.Drain)
	return fmt.Sprintf("%s/%s/%s", v1alpha1.SharingHash(want.Sharing), mode, timeout)
}

// drainSettings fills the API's defaults: WaitForIdle, 10 minutes.
func drainSettings(d *v1alpha1.Drain) (v1alpha1.DrainMode, time.Duration) {
	mode, timeout := v1alpha1.DrainWaitForIdle, DefaultDrainTimeout
	if d != nil {
		if d.Mode != "" {
			mode = d.Mode
		}
		if d.Timeout != nil {
			timeout = d.Timeout.Duration
		}
	}
	return mode, timeout
}

// convergeListed converges one GPU that spec lists. When the drain is on and the change is disruptive (a
// strategy or MIG layout change, as the controller decides it), it first empties the GPU on a goroutine of
// its own and applies on the pass after the drain ended; meanwhile it reports Draining. It returns what
// kept the GPU from its desired sharing and the GPU's drain status.
func (r *Reconciler) convergeListed(ctx context.Context, sc *scope, dev gpu.Device, want v1alpha1.GPUDesired) (*v1alpha1.GPUDrainStatus, error) {
	if !r.drainOn() {
		return nil, r.converge(ctx, dev, want.Sharing)
	}
	from, _ := sharing.AppliedShape(applied(dev, r.observe(dev.UUID)))
	disruptive := sharing.Disruptive(from, sharing.ShapeOf(want.Sharing))
	key := drainKey(want)

	d := r.drains.get(dev.UUID)
	if d != nil && (d.key != key || !disruptive) {
		// The spec changed, or the GPU reached the shape by other means: this drain and its backoff no
		// longer apply. A GPU that stays cordoned goes straight into the next drain.
		r.drains.remove(dev.UUID)
		if d.cordoned && !disruptive {
			sc.uncordon = append(sc.uncordon, dev.UUID)
		}
		if !disruptive {
			return nil, r.converge(ctx, dev, want.Sharing)
		}
		return r.startDrain(ctx, sc, dev, want, key, d.cordoned, 0)
	}
	if !disruptive {
		return nil, r.converge(ctx, dev, want.Sharing)
	}
	if d == nil {
		return r.startDrain(ctx, sc, dev, want, key, false, 0)
	}

	r.drains.mu.Lock()
	done, derr := d.done, d.err
	r.drains.mu.Unlock()
	now := r.now()
	switch {
	case !done:
		return r.drains.status(d, v1alpha1.DrainPhaseDraining), drainingError(r.drains.snapshot(d))

	case derr == nil && d.failErr == nil:
		// The GPU is empty: apply, then advertise it again as the status of this pass describes it.
		observeDrain(dev.UUID, d.started, now, drainOutcomeDrained)
		err := r.converge(ctx, dev, want.Sharing)
		sc.uncordon = append(sc.uncordon, dev.UUID)
		d.cordoned = false
		if err == nil || transient(err) {
			// Done, or worth a retry with the rate limiter's backoff (which drains again first).
			r.drains.remove(dev.UUID)
			return nil, err
		}
		// No pod is left but the change was refused (processes that belong to no pod: GPUBusy; a MIG mode
		// change waiting for a GPU reset): the GPU runs as it was and is tried again after the backoff.
		r.fail(ctx, d, err, now)
		r.decorateFailure(d, dev, "the GPU was drained but the change was refused", "is advertised again as it is")
		return r.drains.status(d, v1alpha1.DrainPhaseFailed), d.failErr

	case d.failErr == nil:
		// The drain ended badly (timed out or failed): leave the GPU as it was and advertise it again.
		sc.uncordon = append(sc.uncordon, dev.UUID)
		d.cordoned = false
		reason, outcomeLabel := v1alpha1.ReasonDrainFailed, drainOutcomeFailed
		if errors.Is(derr, drain.ErrDrainTimeout) {
			reason, outcomeLabel = v1alpha1.ReasonDrainTimedOut, drainOutcomeTimedOut
		}
		observeDrain(dev.UUID, d.started, now, outcomeLabel)
		r.fail(ctx, d, outcome.Newf(reason, "%s", derr.Error()), now)
		r.decorateFailure(d, dev, "drain", "was left as it was and is advertised again")
		return r.drains.status(d, failedPhase(d.failErr)), d.failErr

	case now.Before(d.retryAt):
		return r.drains.status(d, failedPhase(d.failErr)), d.failErr
	}
	// The backoff has passed: drain again for the same desired sharing.
	r.drains.remove(dev.UUID)
	return r.startDrain(ctx, sc, dev, want, key, false, d.failures)
}

// fail records a failed drain (or change after a drain) and when to drain again.
func (r *Reconciler) fail(ctx context.Context, d *gpuDrain, err error, now time.Time) {
	d.failures++
	backoff, limit := r.DrainBackoff, r.DrainBackoffMax
	if backoff <= 0 {
		backoff = DefaultDrainBackoff
	}
	if limit <= 0 {
		limit = DefaultDrainBackoffMax
	}
	for i := 1; i < d.failures && backoff < limit; i++ {
		backoff *= 2
	}
	d.retryAt = now.Add(min(backoff, limit)).Truncate(time.Second)
	d.failErr = err
	reason, msg := reasonFor(err)
	ctrl.LoggerFrom(ctx).Info("GPU drain failed; the GPU is advertised again and drained again after the backoff",
		"reason", reason, "message", msg, "retryAt", d.retryAt.UTC().Format(time.RFC3339), "failures", d.failures)
}

// decorateFailure says in the message what failed, what the GPU runs now and when the agent tries again.
func (r *Reconciler) decorateFailure(d *gpuDrain, dev gpu.Device, what, left string) {
	o, ok := outcome.As(d.failErr)
	if !ok {
		return
	}
	now := token(v1alpha1.GPUStatus{Applied: applied(dev, r.observe(dev.UUID))})
	o.Message = fmt.Sprintf("%s for %s: %s; GPU %d (%s) %s; the agent drains it again at %s or when its spec changes",
		what, d.target, o.Message, dev.Index, now, left, d.retryAt.UTC().Format(time.RFC3339))
}

func failedPhase(err error) v1alpha1.DrainPhase {
	if o, ok := outcome.As(err); ok && o.Reason == v1alpha1.ReasonDrainTimedOut {
		return v1alpha1.DrainPhaseTimedOut
	}
	return v1alpha1.DrainPhaseFailed
}

// startDrain cordons the GPU and starts draining it on a goroutine; the drain wakes a pass whenever it
// progresses or ends. A layout or strategy the GPU cannot take is refused first, so no pod is ever
// evicted for a change that cannot be applied.
func (r *Reconciler) startDrain(ctx context.Context, sc *scope, dev gpu.Device, want v1alpha1.GPUDesired, key string, cordoned bool, failures int) (*v1alpha1.GPUDrainStatus, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("gpu", dev.UUID, "index", dev.Index)
	if err := precheck(dev, want.Sharing); err != nil {
		if cordoned {
			sc.uncordon = append(sc.uncordon, dev.UUID)
		}
		return nil, err
	}
	mode, timeout := drainSettings(want.Drain)
	if !cordoned {
		// A registration error is retried by the device plugin's own loop; the GPU is hidden either way.
		if err := r.Devices.Cordon(ctx, dev.UUID); err != nil {
			log.Error(err, "Device plugin update after cordoning GPU failed")
		}
	}
	r.drains.mu.Lock()
	base := r.drains.base
	r.drains.mu.Unlock()
	if base == nil {
		base = context.WithoutCancel(ctx)
	}
	dctx, cancel := context.WithCancel(ctrl.LoggerInto(base, log))
	d := &gpuDrain{
		key: key, target: describeDesired(want.Sharing), mode: mode, timeout: timeout,
		started: r.now().Truncate(time.Second), cancel: cancel, cordoned: true, failures: failures,
	}
	r.drains.mu.Lock()
	if r.drains.byGPU == nil {
		r.drains.byGPU = map[string]*gpuDrain{}
	}
	r.drains.byGPU[dev.UUID] = d
	r.drains.mu.Unlock()

	var migs []string
	for _, in := range dev.Instances {
		if in.UUID != "" {
			migs = append(migs, in.UUID)
		}
	}
	log.Info("Draining GPU before a disruptive change", "target", d.target, "mode", string(mode), "timeout", timeout.String())
	go func() {
		res, err := r.Drainer.Drain(dctx, drain.Request{
			GPUUUID: dev.UUID, MIGUUIDs: migs, Mode: mode, Timeout: timeout,
			Progress: func(s drain.Step) { r.drains.progress(d, s); r.notify() },
		})
		r.drains.mu.Lock()
		d.done, d.err, d.pods = true, err, podNames(res.Remaining)
		r.drains.mu.Unlock()
		log.Info("GPU drain ended", "remaining", len(res.Remaining), "evicted", len(res.Evicted), "duration", res.Duration.String(), "error", errString(err))
		r.notify()
	}()
	return r.drains.status(d, v1alpha1.DrainPhaseDraining), drainingError(r.drains.snapshot(d))
}

// precheck refuses, without changing anything, a desired sharing the GPU cannot take as it is.
func precheck(dev gpu.Device, want v1alpha1.Sharing) error {
	switch want.Strategy {
	case v1alpha1.StrategyMIG:
		if want.MIG == nil {
			return outcome.Newf(v1alpha1.ReasonLayoutDoesNotFit, "sharing.mig is missing")
		}
		return mig.Check(dev, mig.Wants(*want.MIG))
	case v1alpha1.StrategyMPS, v1alpha1.StrategyTimeSlicing:
		return needsMIGOff(dev, want.Strategy)
	}
	return nil
}

// progress records a drain step for the status: the pods still there and the latest message.
func (ds *drains) progress(d *gpuDrain, s drain.Step) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	switch s.Phase {
	case drain.PhaseListed, drain.PhaseWaiting, drain.PhaseTimedOut:
		d.listed, d.pods = true, podNames(s.Pods)
	case drain.PhaseIdle:
		d.listed, d.pods = true, nil
	}
	switch s.Phase {
	case drain.PhaseEvictionBlocked, drain.PhaseEvicted, drain.PhaseListFailed, drain.PhaseFailed, drain.PhaseTimedOut:
		d.message = s.Message
	case drain.PhaseListed, drain.PhaseWaiting, drain.PhaseIdle:
		// The latest eviction message stays while its pod still uses the GPU.
		if d.message != "" && !mentionsAny(d.message, d.pods) {
			d.message = ""
		}
	}
}

// drainView is a copy of what a drain's goroutine writes.
type drainView struct {
	target, message string
	mode            v1alpha1.DrainMode
	timeout         time.Duration
	pods            []string
	listed          bool
}

func (ds *drains) snapshot(d *gpuDrain) drainView {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return drainView{target: d.target, message: d.message, mode: d.mode, timeout: d.timeout, pods: append([]string(nil), d.pods...), listed: d.listed || d.done}
}

// status is the GPU's drain block in status.
func (ds *drains) status(d *gpuDrain, phase v1alpha1.DrainPhase) *v1alpha1.GPUDrainStatus {
	v := ds.snapshot(d)
	st := &v1alpha1.GPUDrainStatus{
		Phase:     phase,
		Target:    v.target,
		Mode:      v.mode,
		Timeout:   &metav1.Duration{Duration: v.timeout},
		StartTime: ptrTime(d.started),
		Pods:      v.pods,
		Message:   v.message,
	}
	if phase != v1alpha1.DrainPhaseDraining {
		st.RetryTime = ptrTime(d.retryAt)
	}
	return st
}

// drainingError is the Applied=False Draining condition of a GPU being drained; its message names the
// pods still using the GPU.
func drainingError(v drainView) error {
	head := fmt.Sprintf("GPU cordoned for %s (%s, timeout %s)", v.target, v.mode, v.timeout)
	var msg string
	switch {
	case !v.listed:
		msg = head + "; looking for the pods that use it"
	case len(v.pods) == 0:
		msg = head + "; no pod uses it any more, applying"
	case v.mode == v1alpha1.DrainEvict:
		msg = fmt.Sprintf("%s; evicting %d pods: %s", head, len(v.pods), strings.Join(v.pods, ", "))
	default:
		msg = fmt.Sprintf("%s; waiting for %d pods to end: %s", head, len(v.pods), strings.Join(v.pods, ", "))
	}
	if v.message != "" {
		msg += "; " + v.message
	}
	return outcome.Newf(v1alpha1.ReasonDraining, "%s", msg)
}

// cleanupDrains stops the drains of GPUs this pass did not converge (gone from spec or from NVML) and
// advertises them again.
func (r *Reconciler) cleanupDrains(sc *scope, listed map[string]bool) {
	for _, uuid := range r.drains.uuids() {
		if listed[uuid] {
			continue
		}
		if d := r.drains.remove(uuid); d != nil && d.cordoned {
			sc.uncordon = append(sc.uncordon, uuid)
		}
	}
}

// publishDevices tells the device plugin the status this pass computed (cheap and idempotent, so on
// every pass), then advertises again the GPUs whose drain ended.
func (r *Reconciler) publishDevices(ctx context.Context, sc *scope) {
	if r.Devices == nil || sc.invErr != nil {
		return
	}
	log := ctrl.LoggerFrom(ctx)
	if err := r.Devices.UpdateFromStatus(ctx, sc.node.Status); err != nil {
		// The device plugin retries registration on its own loop.
		log.Error(err, "Device plugin update failed")
	}
	for _, uuid := range sc.uncordon {
		if err := r.Devices.Uncordon(ctx, uuid); err != nil {
			log.Error(err, "Device plugin update after uncordoning GPU failed", "gpu", uuid)
		}
	}
}

func podNames(pods []drain.PodRef) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.String())
	}
	return out
}

func mentionsAny(s string, pods []string) bool {
	for _, p := range pods {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

func ptrTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &mt
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
