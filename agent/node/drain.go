package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/vacate"
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

// SlicePublisher publishes each status a pass computes as DRA ResourceSlices; dra.Driver implements it.
// It must not block: the slices are written in the background, and their errors are reported there.
type SlicePublisher interface {
	PublishStatus(node *v1alpha1.GPUNode)
}

// Vacater empties one GPU of its pods, the drain's vacate step; vacate.Vacater implements it.
type Vacater interface {
	Vacate(ctx context.Context, req vacate.Request) (vacate.Result, error)
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

// drainOn says whether disruptive changes drain first: a drainer, and something that stops advertising
// the GPU while it is drained (the device plugin's Cordon, or the ResourceSlices, which leave out a GPU
// whose status says Draining).
func (r *Reconciler) drainOn() bool { return r.Vacater != nil && (r.Devices != nil || r.Slices != nil) }

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
	now := r.clock().Now()
	s := r.drains.state(dev.UUID)
	var err error
	for _, o := range r.drains.messages(dev.UUID, now) {
		var acts []drainAction
		s, acts = r.step(ctx, dev, s, o)
		s, _ = r.perform(ctx, sc, dev, want, s, acts)
	}
	o := r.passObservation(sc, dev, want, now)
	// Cordoned is left in the same pass: a GPU cordoned by this observation starts draining at once.
	for range 2 {
		var acts []drainAction
		s, acts = r.step(ctx, dev, s, o)
		s, err = r.perform(ctx, sc, dev, want, s, acts)
		if s.phase != phaseCordoned {
			break
		}
	}
	r.drains.set(dev.UUID, s)
	return r.report(s, err)
}

// passObservation is what this pass knows of the GPU for the drain: what is wanted, whether it is a
// disruptive change from what is in force, and whether the GPU could take it.
func (r *Reconciler) passObservation(sc *scope, dev gpu.Device, want v1alpha1.GPUDesired, now time.Time) observation {
	inForce := applied(dev, r.observe(dev.UUID))
	r.markClaimed(inForce, dev.UUID)
	from, _ := sharing.AppliedShape(inForce)
	// Dynamic MIG is no hardware state either: the status last published says whether it is in force.
	from.Dynamic = publishedMIGDynamic(sc.node, dev.UUID)
	if !from.Shim && publishedShim(sc.node, dev.UUID, from.Strategy) {
		// The shim's scheduler lives in the agent, so a restarted agent observes none; the status the agent
		// before it published says the shim was in force. Starting the scheduler again is a resume (shim
		// processes reconnect and re-announce), not turning oversubscription on under running work.
		from.Shim = true
	}
	// Sizing is no hardware state: what the status last published says is in force.
	from.Sized = publishedSizing(sc.node, dev.UUID).PerClaim()
	mode, timeout := drainSettings(want.Drain)
	_, admitErr := r.Admit(dev, want.Sharing)
	to := sharing.ShapeOf(want.Sharing)
	target := drainTarget{key: drainKey(want), target: describeDesired(want.Sharing), mode: mode, timeout: timeout}
	change, layoutOnly := layoutChange(dev, inForce, from, to, want.Sharing)
	if layoutOnly {
		// A fixed-layout change of a dynamic GPU drains only what it takes; one that takes nothing is
		// applied under running work.
		target.scope = scopeOf(dev.Index, change)
	}
	takesNothing := layoutOnly && change.Empty()
	return observation{
		kind: obsPass, now: now,
		want:       target,
		disruptive: sharing.Disruptive(from, to) && !takesNothing,
		admitted:   admitErr == nil,
		backoff:    r.DrainBackoff, backoffMax: r.DrainBackoffMax,
	}
}

// perform does a transition's actions. Converge's result is fed back to the machine (obsApplied), so
// a change refused after a drain fails the drain.
func (r *Reconciler) perform(ctx context.Context, sc *scope, dev gpu.Device, want v1alpha1.GPUDesired, s drainState, acts []drainAction) (drainState, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("gpu", dev.UUID, "index", dev.Index)
	var convergeErr error
	for _, a := range acts {
		switch a {
		case actCordon:
			// The slices follow the status this pass publishes (Draining). A registration error is retried
			// by the device plugin's own loop; the GPU is hidden either way.
			if r.Devices == nil {
				continue
			}
			if err := r.Devices.Cordon(ctx, dev.UUID); err != nil {
				log.Error(err, "Device plugin update after cordoning GPU failed")
			}
		case actStartDrain:
			r.startDrain(ctrl.LoggerInto(r.drains.baseContext(ctx), log), dev, s)
		case actStopDrain:
			r.drains.stop(dev.UUID)
		case actUncordon:
			sc.uncordon = append(sc.uncordon, dev.UUID)
		case actConverge:
			convergeErr = r.converge(ctx, dev, want.Sharing)
			var more []drainAction
			s, more = r.step(ctx, dev, s, observation{kind: obsApplied, now: r.clock().Now(), err: convergeErr,
				backoff: r.DrainBackoff, backoffMax: r.DrainBackoffMax})
			s, _ = r.perform(ctx, sc, dev, want, s, more)
		}
	}
	return s, convergeErr
}

// startDrain runs the drain of s on its own goroutine; the drain wakes a pass whenever it progresses
// or ends.
func (r *Reconciler) startDrain(ctx context.Context, dev gpu.Device, s drainState) {
	log := ctrl.LoggerFrom(ctx)
	var migs []string
	for _, in := range dev.Instances {
		if in.UUID != "" {
			migs = append(migs, in.UUID)
		}
	}
	req := vacate.Request{GPUUUID: dev.UUID, GPUIndex: int32(dev.Index), MIGUUIDs: migs, Mode: s.mode, Timeout: s.timeout}
	if sc := s.scope; sc != nil {
		// Only the pods of what the change takes: the device plugin's pods of its MIG devices (no pod
		// holds a MIG GPU whole) and the pods of its claims.
		req.MIGUUIDs = sc.migs
		claims := sc.claims
		req.ClaimScope = &claims
		log.Info("Draining the pods a fixed-layout change takes", "target", s.target, "takes", strings.Join(sc.reasons, "; "),
			"mode", string(s.mode), "timeout", s.timeout.String())
	} else {
		log.Info("Draining GPU before a disruptive change", "target", s.target, "mode", string(s.mode), "timeout", s.timeout.String())
	}
	r.drains.start(ctx, dev.UUID, s.seq, s.view, func(dctx context.Context, progress func(vacate.Step)) ([]string, error) {
		req.Progress = progress
		res, err := r.Vacater.Vacate(dctx, req)
		log.Info("GPU drain ended", "remaining", len(res.Remaining), "evicted", len(res.Evicted), "duration", res.Duration.String(), "error", errString(err))
		return podNames(res.Remaining), err
	}, r.notify)
}

// step is next plus what the machine leaves to the reconciler: a new failure's message says what
// failed, what the GPU runs now and when the agent tries again. The decorated outcome is a new value
// (an error is never changed in place).
func (r *Reconciler) step(ctx context.Context, dev gpu.Device, s drainState, o observation) (drainState, []drainAction) {
	before := s.phase
	started := s.started
	s, acts := next(s, o)
	if before == phaseDraining && (s.phase == phaseDrained || s.phase == phaseFailed) {
		r.Metrics.observeDrain(r.NodeName, dev.UUID, started, o.now, drainOutcomeOf(s))
	}
	if s.phase != phaseFailed || before == phaseFailed {
		return s, acts
	}
	o2, ok := outcome.As(s.failure)
	if !ok {
		return s, acts
	}
	what, left := "drain", "was left as it was and is advertised again"
	if s.changeRefused {
		what, left = "the GPU was drained but the change was refused", "is advertised again as it is"
	}
	now := token(v1alpha1.GPUStatus{Applied: applied(dev, r.observe(dev.UUID))})
	s.failure = outcome.Newf(o2.Reason, "%s for %s: %s; GPU %d (%s) %s; the agent drains it again at %s or when its spec changes",
		what, s.target, o2.Message, dev.Index, now, left, s.retryAt.UTC().Format(time.RFC3339))
	ctrl.LoggerFrom(ctx).Info("GPU drain failed; the GPU is advertised again and drained again after the backoff",
		"reason", o2.Reason, "message", o2.Message, "retryAt", s.retryAt.UTC().Format(time.RFC3339), "failures", s.failures)
	return s, acts
}

// report is the GPU's drain status and what kept it from its desired sharing, from its drain state.
func (r *Reconciler) report(s drainState, convergeErr error) (*v1alpha1.GPUDrainStatus, error) {
	switch s.phase {
	case phaseIdle:
		return nil, convergeErr
	case phaseFailed, phaseBackoff:
		return drainStatus(s, failedPhase(s.failure)), s.failure
	}
	return drainStatus(s, v1alpha1.DrainPhaseDraining), drainingError(s.view)
}

// drainOutcomeOf labels a drain that just ended for gpusharing_agent_drain_duration_seconds.
func drainOutcomeOf(s drainState) string {
	switch {
	case s.phase == phaseDrained:
		return drainOutcomeDrained
	case failedPhase(s.failure) == v1alpha1.DrainPhaseTimedOut:
		return drainOutcomeTimedOut
	}
	return drainOutcomeFailed
}

func failedPhase(err error) v1alpha1.DrainPhase {
	if o, ok := outcome.As(err); ok && o.Reason == v1alpha1.ReasonDrainTimedOut {
		return v1alpha1.DrainPhaseTimedOut
	}
	return v1alpha1.DrainPhaseFailed
}

// drainStatus is the GPU's drain block in status.
func drainStatus(s drainState, phase v1alpha1.DrainPhase) *v1alpha1.GPUDrainStatus {
	st := &v1alpha1.GPUDrainStatus{
		Phase:     phase,
		Target:    s.target,
		Mode:      s.mode,
		Timeout:   &metav1.Duration{Duration: s.timeout},
		StartTime: ptrTime(s.started),
		Pods:      s.view.pods,
		Message:   scopeMessage(s.view),
	}
	if phase != v1alpha1.DrainPhaseDraining {
		st.RetryTime = ptrTime(s.retryAt)
	}
	return st
}

// scopeMessage is the drain status's message: for a drain of what a fixed-layout change takes, what it
// takes and why, before the latest step.
func scopeMessage(v drainView) string {
	if v.scope == "" {
		return v.message
	}
	if v.message == "" {
		return "drains only " + v.scope
	}
	return "drains only " + v.scope + "; " + v.message
}

// drainingError is the Applied=False Draining condition of a GPU being drained; its message names the
// pods still using the GPU.
func drainingError(v drainView) error {
	head := fmt.Sprintf("GPU cordoned for %s (%s, timeout %s)", v.target, v.mode, v.timeout)
	if v.scope != "" {
		head = fmt.Sprintf("GPU drained of what %s takes (%s, timeout %s): %s; its other claims keep running", v.target, v.mode, v.timeout, v.scope)
	}
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
		s := r.drains.state(uuid)
		r.drains.stop(uuid)
		r.drains.set(uuid, drainState{})
		if s.phase.cordoned() {
			sc.uncordon = append(sc.uncordon, uuid)
		}
	}
}

// publishDevices tells the device plugin the status this pass computed (cheap and idempotent, so on
// every pass), then advertises again the GPUs whose drain ended.
func (r *Reconciler) publishDevices(ctx context.Context, sc *scope) {
	if sc.invErr != nil {
		return
	}
	if r.Slices != nil {
		r.Slices.PublishStatus(sc.node)
	}
	if r.Devices == nil {
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

func podNames(pods []vacate.PodRef) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.String())
	}
	return out
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

// publishedShim says whether the GPUNode status last published (by this agent or the one before a
// restart) shows the shim in force on the GPU with this strategy.
func publishedShim(node *v1alpha1.GPUNode, uuid string, strategy v1alpha1.Strategy) bool {
	if node == nil {
		return false
	}
	for _, g := range node.Status.GPUs {
		if g.UUID == uuid {
			return g.Applied != nil && g.Applied.Shim != nil && g.Applied.Strategy == strategy
		}
	}
	return false
}

// publishedSizing is the sizing the GPUNode status last published (by this agent or the one before a
// restart) shows in force on the GPU; nil for fixed shares.
func publishedSizing(node *v1alpha1.GPUNode, uuid string) *v1alpha1.Sizing {
	if node == nil {
		return nil
	}
	for _, g := range node.Status.GPUs {
		if g.UUID == uuid && g.Applied != nil {
			return g.Applied.Sizing
		}
	}
	return nil
}
