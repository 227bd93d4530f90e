package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Event reasons of publishing, on the node's GPUNode.
const (
	// ReasonSlicesNotPublished: a write of the node's ResourceSlices failed (the message says why) after
	// the last one had worked; the controller retries with backoff, and no event repeats it. What to do:
	// act on the message, for example the agent's permission to write resourceslices or an API server
	// that does not serve resource.k8s.io/v1; the agent retries on its own.
	ReasonSlicesNotPublished = "ResourceSlicesNotPublished"
	// ReasonSlicesPublished: the node's ResourceSlices were written again after ResourceSlicesNotPublished.
	// What to do: nothing.
	ReasonSlicesPublished = "ResourceSlicesPublished"
	// ReasonSliceFieldsDropped: the API server stored a slice without some fields, for a feature gate that
	// is off (DRAConsumableCapacity for a GPU sized per claim); the message names the gate. What to do:
	// turn the named feature gate on in the cluster's control plane, or size no GPU per claim there.
	ReasonSliceFieldsDropped = "ResourceSliceFieldsDropped"
)

// Pool cuts a node's devices into the slices of its one pool, at most ResourceSliceMaxDevices each (64,
// ResourceSliceMaxDevicesWithAdvancedFeatures, where a device consumes counters). A node publishes at
// least one slice of devices, empty when it offers nothing, so the scheduler sees the pool. Counter sets
// (dynamic MIG GPUs) go in a slice of their own, first: the API takes devices or counters per slice.
func Pool(devices []resourcev1.Device, counters ...resourcev1.CounterSet) resourceslice.Pool {
	var pool resourceslice.Pool
	for len(counters) > 0 {
		n := min(len(counters), resourcev1.ResourceSliceMaxCounterSets)
		pool.Slices = append(pool.Slices, resourceslice.Slice{SharedCounters: counters[:n]})
		counters = counters[n:]
	}
	limit := resourcev1.ResourceSliceMaxDevices
	for _, d := range devices {
		if len(d.ConsumesCounters) > 0 {
			limit = resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
	}
	for len(devices) > limit {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: devices[:limit]})
		devices = devices[limit:]
	}
	pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: devices})
	return pool
}

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// Node is the node whose one pool (named after it) is published; its Node object owns the slices,
	// so they are garbage-collected with it.
	Node string
	// Kube reads the Node and lists, watches and writes the node's slices.
	Kube kubernetes.Interface
	// Shares names the shares as the device plugin does (replica counts of shim shares).
	Shares share.Config
	// SyncDelay is how long after the controller sees a change to the node's slices it checks them
	// again, putting back a slice someone else changed or deleted (zero: resourceslice.DefaultSyncDelay).
	SyncDelay time.Duration
	// Log gets every publishing error.
	Log logr.Logger
	// Metrics, when set, counts the errors and says whether the last sync succeeded.
	Metrics *SliceMetrics
	// Events, when set, records the events above on the GPUNode of the last status published.
	Events events.EventRecorder
	// Withheld, when set, leaves out the shares it holds back: where the device plugin serves beside
	// DRA, those of a GPU a device plugin pod holds (agent/owner), so the kube-scheduler allocates no
	// claim there that could only wait. The agent publishes a status again when its answers change.
	Withheld func(share.Device) bool
}

// Publisher keeps a node's ResourceSlices equal to the devices of the last status it was given, through
// the ResourceSlice controller of k8s.io/dynamic-resource-allocation: it writes only what differs (no
// API call when nothing changed), raises the pool generation where the scheduler must not mix old and
// new slices, watches the node's slices and puts back what someone else changed or deleted, and retries
// failed writes with backoff. PublishStatus only hands the controller the devices, so the agent's pass
// never waits for the API server.
type Publisher struct {
	o PublisherOptions

	// given is closed by the first PublishStatus: the controller starts with devices to publish, never
	// with none (it would delete the slices a previous agent published, and publish them again).
	given     chan struct{}
	givenOnce sync.Once

	mu      sync.Mutex
	ctrl    *resourceslice.Controller
	devices []resourcev1.Device
	// counters are the counter sets devices consume (dynamic MIG GPUs).
	counters []resourcev1.CounterSet
	// version counts the device lists given, so Start knows whether one came while it started.
	version uint64
	// regarding is the GPUNode the events are recorded on (name and uid of the last one published).
	regarding *v1alpha1.GPUNode
	// failing says the last sync failed; lastErr is the error that failed it.
	failing bool
	lastErr error
	// synced says a sync succeeded since Start, and failing was not set after it.
	synced bool
	// noTaints says the API server dropped a device's taints (DRADeviceTaints off): tainted devices are
	// left out of the slices from then on, so a placement that must not be allocated is not offered.
	noTaints bool
}

// NewPublisher returns a publisher for o.Node; Start runs its controller.
func NewPublisher(o PublisherOptions) (*Publisher, error) {
	if o.Node == "" || o.Kube == nil {
		return nil, errors.New("publishing ResourceSlices needs the node name and a client")
	}
	o.Metrics.init(o.Node)
	return &Publisher{o: o, given: make(chan struct{})}, nil
}

// PublishStatus publishes the devices node's status offers (Devices) and remembers node for events. It
// never blocks on the API server: the controller writes in the background.
func (p *Publisher) PublishStatus(node *v1alpha1.GPUNode) {
	p.mu.Lock()
	if node.UID != "" {
		p.regarding = &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID}}
	}
	p.mu.Unlock()
	pending := pendingLayouts(node)
	p.Publish(p.offered(node.Status, pending), counters(node.Status, pending)...)
}

// offered is the devices the status publishes, less those Withheld holds back.
func (p *Publisher) offered(status v1alpha1.GPUNodeStatus, pending map[string][]nvgpu.Placement) []resourcev1.Device {
	if p.o.Withheld == nil {
		return devices(status, p.o.Shares, pending)
	}
	out := []resourcev1.Device{}
	for _, o := range published(status, p.o.Shares, pending) {
		if !p.o.Withheld(o.share) {
			out = append(out, o.dev)
		}
	}
	return out
}

// Publish publishes devices, and the counter sets they consume, as the node's pool.
func (p *Publisher) Publish(devices []resourcev1.Device, counters ...resourcev1.CounterSet) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.given:
		// Semantic: quantities compare by value, not by their cached form. The controller would find
		// nothing to write either; this spares it the copy and the pass through its queue.
		if equality.Semantic.DeepEqual(p.devices, devices) && equality.Semantic.DeepEqual(p.counters, counters) {
			return
		}
	default:
	}
	p.devices, p.counters = devices, counters
	p.version++
	p.givenOnce.Do(func() { close(p.given) })
	if p.ctrl != nil {
		p.ctrl.Update(p.resources())
	}
}

// resources is the desired state the controller syncs to. p.mu must be held.
func (p *Publisher) resources() *resourceslice.DriverResources {
	devices := p.devices
	if p.noTaints {
		devices = slices.DeleteFunc(slices.Clone(devices), func(d resourcev1.Device) bool { return len(d.Taints) > 0 })
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{p.o.Node: Pool(devices, p.counters...)}}
}

// Start runs the controller from the first PublishStatus until ctx ends, then stops it (a manager
// Runnable). The controller lists and watches the node's slices first; until the API server answers, the
// devices given wait.
func (p *Publisher) Start(ctx context.Context) error {
	select {
	case <-p.given:
	case <-ctx.Done():
		return nil
	}
	p.mu.Lock()
	resources, version := p.resources(), p.version
	p.mu.Unlock()
	opts := resourceslice.Options{
		DriverName:   DriverName,
		KubeClient:   p.o.Kube,
		Owner:        &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.o.Node},
		Resources:    resources,
		Queue:        outcomeQueue{TypedRateLimitingInterface: newSliceQueue(), p: p},
		ErrorHandler: p.handleError,
	}
	if p.o.SyncDelay > 0 {
		opts.SyncDelay = &p.o.SyncDelay
	}
	ctrl, err := resourceslice.StartController(klog.NewContext(ctx, p.o.Log), opts)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped before the API server answered the first list.
			return nil
		}
		return fmt.Errorf("starting the ResourceSlice controller: %w", err)
	}
	p.mu.Lock()
	p.ctrl = ctrl
	// noTaints may have been learnt before ctrl was set, from the controller's first writes.
	if p.version != version || p.noTaints {
		ctrl.Update(p.resources())
	}
	p.mu.Unlock()
	<-ctx.Done()
	p.mu.Lock()
	p.ctrl = nil
	p.mu.Unlock()
	// Waits for the controller's goroutines: no write after the agent stopped. The slices stay.
	ctrl.Stop()
	return nil
}

// Stats counts the controller's writes since Start (zero before).
func (p *Publisher) Stats() resourceslice.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctrl == nil {
		return resourceslice.Stats{}
	}
	return p.ctrl.GetStats()
}

// Synced says the node's slices were synced since Start and the last sync succeeded.
func (p *Publisher) Synced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.synced && !p.failing
}

// handleError is the controller's ErrorHandler. A DroppedFieldsError comes from a write that succeeded
// (the controller takes what the API server stored as published, so it does not write again); every
// other error failed a sync, which the controller retries with backoff (outcomeQueue reports it).
func (p *Publisher) handleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		p.o.Log.Error(err, "The API server dropped fields of a ResourceSlice", "node", p.o.Node, "features", dropped.DisabledFeatures())
		p.o.Metrics.countError(p.o.Node, errorDroppedFields)
		p.event(corev1.EventTypeWarning, ReasonSliceFieldsDropped, err.Error())
		if slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints") {
			p.withoutTaints()
		}
		return
	}
	p.o.Log.Error(err, "Publishing ResourceSlices failed; retrying", "node", p.o.Node, "step", msg)
	p.o.Metrics.countError(p.o.Node, errorFailed)
	p.mu.Lock()
	p.lastErr = err
	p.mu.Unlock()
}

// withoutTaints leaves tainted devices out from now on: the API server stored them untainted, so the
// scheduler would allocate them. The controller calls the error handler from its sync, not holding its
// lock, so the new desired state can be handed to it here.
func (p *Publisher) withoutTaints() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.noTaints {
		return
	}
	p.noTaints = true
	p.o.Log.Info("The API server does not store device taints (DRADeviceTaints off); tainted devices are not published", "node", p.o.Node)
	if p.ctrl != nil {
		p.ctrl.Update(p.resources())
	}
}

// syncEnded records a sync's outcome; an event marks where publishing starts to fail and where it
// works again.
func (p *Publisher) syncEnded(ok bool) {
	p.mu.Lock()
	wasFailing := p.failing
	p.failing = !ok
	p.synced = p.synced || ok
	err := p.lastErr
	if ok {
		p.lastErr = nil
	}
	p.mu.Unlock()
	p.o.Metrics.setPublished(p.o.Node, ok)
	switch {
	case !ok && !wasFailing:
		note := "publishing the node's ResourceSlices failed; retrying"
		if err != nil {
			note = err.Error()
		}
		p.event(corev1.EventTypeWarning, ReasonSlicesNotPublished, note)
	case ok && wasFailing:
		p.event(corev1.EventTypeNormal, ReasonSlicesPublished, "the node's ResourceSlices are published again")
	}
}

func (p *Publisher) event(typ, reason, note string) {
	p.mu.Lock()
	regarding := p.regarding
	p.mu.Unlock()
	if p.o.Events == nil || regarding == nil {
		return
	}
	p.o.Events.Eventf(regarding, nil, typ, reason, "Publish", "%s", note)
}

// newSliceQueue is the queue the controller makes when given none.
func newSliceQueue() workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "node_resource_slices"})
}

// outcomeQueue is the controller's work queue, through which the publisher learns how each sync ended:
// after a sync of a pool the controller forgets the pool's backoff when it succeeded, and adds the pool
// back rate-limited when it failed (the work queue's contract, resourceslice's processNextWorkItem).
type outcomeQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	p *Publisher
}

func (q outcomeQueue) Forget(pool string) {
	q.TypedRateLimitingInterface.Forget(pool)
	q.p.syncEnded(true)
}

func (q outcomeQueue) AddRateLimited(pool string) {
	q.p.syncEnded(false)
	q.TypedRateLimitingInterface.AddRateLimited(pool)
}

// Driver is the agent's DRA side as the reconciler sees it (a node.SlicePublisher): each status goes to
// the kubelet plugin first, then to the slices, so a device the scheduler can allocate is one the plugin
// can prepare.
type Driver struct {
	Slices *Publisher
	// Plugin is nil where the node publishes slices without serving the kubelet plugin (tests, the demo).
	Plugin *KubeletPlugin
}

// PublishStatus tells the plugin the status's shares and publishes them.
func (d *Driver) PublishStatus(node *v1alpha1.GPUNode) {
	if d.Plugin != nil {
		d.Plugin.UpdateNode(node)
	}
	d.Slices.PublishStatus(node)
}
