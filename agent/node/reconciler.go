// Package node is the agent's reconciler for its own GPUNode: it reads the desired sharing per GPU from
// spec, converges each GPU through the mig, mps and timeslice packages, and publishes what is really in
// force in status, with one status write per pass and only when something changed.
package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Reconciler converges this node's GPUs to its GPUNode's spec and reports them in its status.
type Reconciler struct {
	Client client.Client
	// Live reads the GPUNode from the API server when a status write from Client's cache conflicted
	// (the manager's APIReader; see writeStatus); nil reads through Client.
	Live     client.Reader
	NodeName string
	Strategies
	// PodNames names the pods of shim clients by pid ("namespace/name"); nil leaves status.shim's pod empty.
	PodNames func(pids []int32) map[int32]string
	// Health reports GPUs that raised a critical Xid; nil watches nothing (every GPU counts as healthy).
	Health HealthSource
	// Recorder emits an event when a GPU's Applied condition changes; nil emits none.
	Recorder events.EventRecorder
	// Resync is how often the GPUs are checked when nothing else triggers a pass (hardware sends no
	// events the agent can watch: a daemon dying or a process starting shows only when looked at).
	Resync time.Duration
	// Wake, when set, triggers a pass (the MPS manager's and the drains' notifications).
	Wake <-chan event.GenericEvent
	// Notify sends on Wake without blocking; drains call it when they progress or end.
	Notify func()
	// Metrics, when set, mirror each published status (NewMetrics).
	Metrics *Metrics
	// Usage, when set, is the accounting whose snapshot fills each GPU's status.usage (usage.go).
	Usage UsageSource
	// Claims, when set, lists the sized claims the DRA kubelet plugin prepared, which fill each sized
	// GPU's status.sized (sized.go).
	Claims SizedClaimSource
	// MIGClaims, when set, lists the MIG instances the DRA kubelet plugin created for claims, named with
	// their claims in the status of dynamic MIG GPUs (dynmig.go).
	MIGClaims ClaimedMIG
	// SkipNameValidation lets several agents run in one process (the demo's simulated nodes).
	SkipNameValidation bool

	// Devices, when set, is told every status a pass computes (the kubelet device plugin).
	Devices DevicePlugin
	// Slices, when set, publishes every status a pass computes as DRA ResourceSlices.
	Slices SlicePublisher
	// Vacater, with Devices or Slices, empties a GPU before a disruptive change (see drain.go). Without
	// them, a disruptive change is applied at once and refused with GPUBusy while processes use the GPU.
	Vacater Vacater
	// DrainBackoff and DrainBackoffMax bound the wait before a GPU whose drain failed is drained again
	// for the same desired sharing (defaults DefaultDrainBackoff, DefaultDrainBackoffMax).
	DrainBackoff, DrainBackoffMax time.Duration
	// Clock decides drain start and retry times; nil means the real clock.
	Clock clock.PassiveClock

	// MPSServerMemory is the device memory an MPS GPU's server holds itself, left out of what its sized
	// device offers claims (sizedCapacity).
	MPSServerMemory uint64

	// ClaimEvictor, with Claims, evicts the pods over their claims on GPUs whose sizing says Evict
	// (claimguard.go); nil only reports them.
	ClaimEvictor vacate.Evictor

	// Unmanaged, with Usage, names the pods' processes on shim and sized MPS GPUs that are not managed
	// there (unmanaged.go); nil checks none.
	Unmanaged *UnmanagedCheck

	drains     drains
	usage      usageState
	claimsOnce sync.Once
	claims     *guard.Claims
}

// scope is what one pass learns, filled by the phases and written once at the end.
type scope struct {
	node      *v1alpha1.GPUNode
	inventory gpu.Inventory
	invErr    error
	gpus      []v1alpha1.GPUStatus
	// transientErr is the first error worth a retry; observedGeneration advances only without one.
	transientErr error
	// uncordon lists the GPUs to advertise again once the device plugin has this pass's status.
	uncordon []string
	// overClaims lists, per sized GPU, the pods over their claims (claimguard.go).
	overClaims map[string][]guard.OverClaim
	// unmanaged lists the checked GPUs with their verdicts (unmanaged.go).
	unmanaged []guard.GPU
}

// Reconcile is one pass: get or create the GPUNode, read the GPUs, converge each, write status.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("gpunode", r.NodeName)
	ctx = ctrl.LoggerInto(ctx, log)

	node, err := r.getOrCreate(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	before := node.DeepCopy()
	sc := &scope{node: node}
	for _, phase := range []func(context.Context, *scope){r.readInventory, r.convergeGPUs, r.setNodeStatus, r.publishDevices, r.guardSizedClaims, r.guardUnmanaged} {
		phase(ctx, sc)
	}
	if !equality.Semantic.DeepEqual(before.Status, node.Status) {
		if err := r.writeStatus(ctx, node); err != nil {
			return ctrl.Result{}, fmt.Errorf("updating GPUNode %s status: %w", r.NodeName, err)
		}
		log.V(1).Info("Published GPUNode status", "summary", node.Status.Summary)
		r.emitEvents(before, node)
	}
	if sc.transientErr != nil {
		// Status already says what failed; the rate limiter retries with backoff.
		return ctrl.Result{}, fmt.Errorf("converging GPUNode %s: %w", r.NodeName, sc.transientErr)
	}
	return ctrl.Result{RequeueAfter: r.requeueAfter()}, nil
}

// writeStatus writes the pass's status. The agent is the status's only writer, so a conflict says the
// cached GPUNode is behind: after an API server outage the informer's watch reconnects on client-go's
// backoff, up to a minute later, and every write from the cache would conflict until then, leaving what
// the agent saw during the outage unpublished. The status is then written over the API server's object,
// but only while its spec is the one the pass converged to: a newer spec waits for the cache, so the
// agent never acts on one object's spec and the next pass on an older one's (which would undo changes).
func (r *Reconciler) writeStatus(ctx context.Context, node *v1alpha1.GPUNode) error {
	err := r.Client.Status().Update(ctx, node)
	if !apierrors.IsConflict(err) {
		return err
	}
	live := &v1alpha1.GPUNode{}
	if gerr := r.live().Get(ctx, types.NamespacedName{Name: node.Name}, live); gerr != nil || live.Generation != node.Generation {
		return err
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Status write from the cache conflicted; writing it over the API server's GPUNode of the same spec")
	live.Status = node.Status
	if err := r.Client.Status().Update(ctx, live); err != nil {
		return err
	}
	node.ResourceVersion = live.ResourceVersion
	return nil
}

// live reads from the API server itself (Live, or Client when that is not cached).
func (r *Reconciler) live() client.Reader {
	if r.Live != nil {
		return r.Live
	}
	return r.Client
}

// requeueAfter is the resync, or sooner when a failed drain's backoff ends first (nothing else would
// trigger that pass).
func (r *Reconciler) requeueAfter() time.Duration {
	next := r.drains.nextRetry()
	if next.IsZero() {
		return r.Resync
	}
	wait := max(next.Sub(r.clock().Now()), time.Second)
	if r.Resync > 0 && r.Resync < wait {
		return r.Resync
	}
	return wait
}

func (r *Reconciler) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

// getOrCreate returns this node's GPUNode, creating it (owned by the Node, when the Node exists) when
// missing: the agent, not the controller, knows the node has GPUs.
func (r *Reconciler) getOrCreate(ctx context.Context) (*v1alpha1.GPUNode, error) {
	node := &v1alpha1.GPUNode{}
	err := r.Client.Get(ctx, types.NamespacedName{Name: r.NodeName}, node)
	if err == nil {
		return node, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("getting GPUNode %s: %w", r.NodeName, err)
	}
	node = &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: r.NodeName}}
	k8sNode := &corev1.Node{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Name: r.NodeName}, k8sNode); {
	case err == nil:
		node.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: k8sNode.Name, UID: k8sNode.UID,
		}}
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("getting Node %s: %w", r.NodeName, err)
	}
	if err := r.Client.Create(ctx, node); err != nil {
		return nil, fmt.Errorf("creating GPUNode %s: %w", r.NodeName, err)
	}
	ctrl.LoggerFrom(ctx).Info("Created GPUNode")
	return node, nil
}

func (r *Reconciler) readInventory(ctx context.Context, sc *scope) {
	sc.inventory, sc.invErr = r.GPU.Inventory(ctx)
	if sc.invErr != nil && !errors.Is(sc.invErr, gpu.ErrUnavailable) {
		sc.transientErr = sc.invErr
	}
}

// convergeGPUs applies each listed GPU's desired sharing and builds every GPU's status.
func (r *Reconciler) convergeGPUs(ctx context.Context, sc *scope) {
	if sc.invErr != nil {
		// Keep the last published GPUs: a failed read says nothing new about them.
		sc.gpus = sc.node.Status.GPUs
		return
	}
	desired := map[string]*v1alpha1.GPUDesired{}
	for i := range sc.node.Spec.GPUs {
		desired[sc.node.Spec.GPUs[i].UUID] = &sc.node.Spec.GPUs[i]
	}
	prev := map[string]*v1alpha1.GPUStatus{}
	for i := range sc.node.Status.GPUs {
		prev[sc.node.Status.GPUs[i].UUID] = &sc.node.Status.GPUs[i]
	}
	listed := map[string]bool{}
	for _, dev := range sc.inventory.Devices {
		want := desired[dev.UUID]
		var err error
		var drainSt *v1alpha1.GPUDrainStatus
		if want != nil {
			listed[dev.UUID] = true
			drainSt, err = r.convergeListed(ctx, sc, dev, *want)
			if transient(err) && sc.transientErr == nil {
				sc.transientErr = err
			}
			// Report what the pass left, not what it started from.
			if fresh, rerr := r.GPU.Device(ctx, dev.UUID); rerr == nil {
				dev = fresh
			} else if err == nil {
				err = rerr
			}
		}
		st := gpuStatus(dev, r.observe(dev.UUID), want, err, prev[dev.UUID])
		st.Drain = drainSt
		st.Usage = r.gpuUsage(dev.UUID, prev[dev.UUID], appliedQoS(&st))
		sc.gpus = append(sc.gpus, st)
	}
	r.cleanupDrains(sc, listed)
}

// HealthSource is what the reconciler needs of the NVML event watcher (agent/health.Watcher).
type HealthSource interface {
	Get(uuid string) (health.Health, bool)
}

func (r *Reconciler) observe(uuid string) observed {
	var o observed
	if st, ok := r.MPS.Status(uuid); ok {
		o.mps = &st
	}
	if ts, ok, err := r.TimeSlice.State(uuid); err == nil && ok {
		o.timeslice = &ts
	}
	if sh, ok := r.Shim.State(uuid); ok {
		if r.PodNames != nil && len(sh.Clients) > 0 {
			pids := make([]int32, 0, len(sh.Clients))
			for _, c := range sh.Clients {
				pids = append(pids, c.PID)
			}
			sh.Pods = r.PodNames(pids)
		}
		o.shim = &sh
	}
	if r.Health != nil {
		if h, ok := r.Health.Get(uuid); ok {
			o.health = &h
		}
		if is, ok := r.Health.(InstanceHealthSource); ok {
			o.instances = is.Instances(uuid)
		}
	}
	return o
}

// setNodeStatus fills the node-level fields and the Ready and Applied conditions.
func (r *Reconciler) setNodeStatus(_ context.Context, sc *scope) {
	st := &sc.node.Status
	r.setSizedClaims(sc, sc.gpus, st.GPUs)
	r.setUnmanaged(sc, sc.gpus, st.GPUs)
	if r.MIGClaims != nil {
		setMIGClaims(sc.gpus, r.MIGClaims.Records())
	} else {
		setMIGClaims(sc.gpus, nil)
	}
	st.GPUs = sc.gpus
	st.DriverVersion, st.CUDAVersion = sc.inventory.DriverVersion, sc.inventory.CUDAVersion
	if sc.invErr == nil {
		st.GPUCount = int32(len(sc.inventory.Devices))
	}
	setReady(st, sc.invErr)
	setApplied(st, sc.node.Spec, sc.invErr)
	setKstatusConditions(st)
	st.Summary = Summary(st.GPUs)
	st.MemoryUsed = memoryUsedSummary(st.GPUs)
	st.MemoryAllocated = memoryAllocatedSummary(st.GPUs)
	st.MIGFree = migFreeSummary(st.GPUs)
	st.Production = productionSummary(st.GPUs)
	st.ClaimedBy = claimedBySummary(st.GPUs, r.claimPods())
	r.setPods(st)
	r.usage.set(st.GPUs)
	if sc.transientErr == nil && sc.invErr == nil {
		st.ObservedGeneration = sc.node.Generation
	}
	r.Metrics.record(r.NodeName, *st)
	r.Metrics.recordSharing(r.NodeName, sc.node.Spec, *st)
}

// setReady: False NVMLUnavailable without NVML, False NVMLError when the read failed, True NoGPUs on a
// node without GPUs, else True InventoryPublished.
func setReady(st *v1alpha1.GPUNodeStatus, invErr error) {
	switch {
	case errors.Is(invErr, gpu.ErrUnavailable):
		setCondition(&st.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNVMLUnavailable, invErr.Error())
	case invErr != nil:
		setCondition(&st.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNVMLError, invErr.Error())
	case st.GPUCount == 0:
		setCondition(&st.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonNoGPUs, "NVML reports no GPU on this node")
	default:
		setCondition(&st.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonInventoryPublished, fmt.Sprintf("%d GPUs, driver %s, CUDA %s", st.GPUCount, st.DriverVersion, st.CUDAVersion))
	}
}

// setApplied counts the listed GPUs that run their desired sharing and names the first that do not.
func setApplied(st *v1alpha1.GPUNodeStatus, spec v1alpha1.GPUNodeSpec, invErr error) {
	byUUID := map[string]v1alpha1.GPUStatus{}
	for _, g := range st.GPUs {
		byUUID[g.UUID] = g
	}
	var applied int32
	var reason string
	var problems []string
	for _, want := range spec.GPUs {
		g, ok := byUUID[want.UUID]
		if !ok {
			if reason == "" {
				reason = v1alpha1.ReasonNVMLError
			}
			problems = append(problems, fmt.Sprintf("GPU %s: NVML reports no such GPU on this node", want.UUID))
			continue
		}
		c := meta.FindStatusCondition(g.Conditions, v1alpha1.ConditionApplied)
		if c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAsDesired && invErr == nil {
			applied++
			continue
		}
		if c != nil && c.Status != metav1.ConditionTrue {
			if reason == "" {
				reason = c.Reason
			}
			problems = append(problems, fmt.Sprintf("GPU %d: %s: %s", g.Index, c.Reason, c.Message))
		}
	}
	st.AppliedGPUs = applied
	switch {
	case invErr != nil:
		r := v1alpha1.ReasonNVMLError
		if errors.Is(invErr, gpu.ErrUnavailable) {
			r = v1alpha1.ReasonNVMLUnavailable
		}
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionFalse, r, "the GPUs cannot be read: "+invErr.Error())
	case len(problems) > 0:
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionFalse, reason, strings.Join(problems, "; "))
	case len(spec.GPUs) == 0:
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonNotDesired, "no policy lists a GPU of this node")
	default:
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, fmt.Sprintf("%d of %d listed GPUs run their desired sharing", applied, len(spec.GPUs)))
	}
}

// emitEvents records one event per condition that changed status or reason in this pass: each GPU's
// Applied (applying, draining, a drain that timed out, a layout that does not fit) and Healthy (an Xid),
// and the node's Ready (NVML lost or back). The event's reason is the condition's; a condition that only
// rewords its message makes no event.
func (r *Reconciler) emitEvents(before, after *v1alpha1.GPUNode) {
	if r.Recorder == nil {
		return
	}
	emit := func(old []metav1.Condition, c metav1.Condition, format string, args ...any) {
		o := meta.FindStatusCondition(old, c.Type)
		if o != nil && o.Status == c.Status && o.Reason == c.Reason {
			return
		}
		if o == nil && c.Status == metav1.ConditionTrue && c.Type != v1alpha1.ConditionApplied {
			// A GPU or node first seen healthy and ready is no news; Applied keeps its event on creation,
			// as it always had, because it says what the GPU was found running.
			return
		}
		typ := corev1.EventTypeNormal
		if c.Status != metav1.ConditionTrue {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(after, nil, typ, c.Reason, "Apply", format, args...)
	}
	if c := meta.FindStatusCondition(after.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		emit(before.Status.Conditions, *c, "%s: %s", c.Type, c.Message)
	}
	old := map[string][]metav1.Condition{}
	for _, g := range before.Status.GPUs {
		old[g.UUID] = g.Conditions
	}
	for _, g := range after.Status.GPUs {
		for _, typ := range []string{v1alpha1.ConditionApplied, v1alpha1.ConditionHealthy, v1alpha1.ConditionWithinClaims, v1alpha1.ConditionManaged} {
			if c := meta.FindStatusCondition(g.Conditions, typ); c != nil {
				emit(old[g.UUID], *c, "GPU %d (%s) %s: %s", g.Index, g.UUID, c.Type, c.Message)
			}
		}
	}
}

// rateLimiter retries a failed pass with controller-runtime's exponential backoff, but never later than
// the resync: through an API server outage every pass fails (its status write is refused), and the
// default cap (1000 s) would leave what the agent observed meanwhile unpublished for many minutes after
// the API server is back.
func (r *Reconciler) rateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	limit := r.Resync
	if limit <= 0 {
		limit = 30 * time.Second
	}
	return workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, limit)
}

// SetupWithManager watches only this node's GPUNode, and wakes on the MPS manager's notifications.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	onlyMine := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == r.NodeName })
	b := ctrl.NewControllerManagedBy(mgr).
		Named("gpunode-agent").
		WithOptions(controller.Options{SkipNameValidation: &r.SkipNameValidation, RateLimiter: r.rateLimiter()}).
		For(&v1alpha1.GPUNode{}, builder.WithPredicates(onlyMine, predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})))
	if r.Wake != nil {
		mine := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: r.NodeName}}}
		})
		b = b.WatchesRawSource(source.Channel(r.Wake, mine))
	}
	// Drains run on goroutines that outlive a pass; they end with the manager.
	if err := mgr.Add(manager.RunnableFunc(r.drains.run)); err != nil {
		return err
	}
	// The first pass must run even when no GPUNode exists yet: that pass creates it.
	kick := make(chan event.GenericEvent, 1)
	kick <- event.GenericEvent{Object: &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: r.NodeName}}}
	b = b.WatchesRawSource(source.Channel(kick, &handler.EnqueueRequestForObject{}))
	return b.Complete(r)
}
