// Package app wires the node agent's parts into a controller-runtime manager, so cmd/agent and the
// simulated nodes of cmd/demo run exactly the same agent.
package app

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/deviceplugin"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Options are the agent's settings, parsed once by its main.
type Options struct {
	// NodeName is this node's name, which is also its GPUNode's.
	NodeName string
	// GPU is the node's GPUs: NVML, a mock, or gpu.Null where NVML is missing.
	GPU gpu.Interface
	// MPSRoot holds each MPS GPU's pipe and log directories and its /dev/shm tmpfs (<root>/<uuid>/{pipe,log,shm}).
	MPSRoot string
	// MPSLauncher is the executable whose mps-launch subcommand starts a GPU's daemon with the GPU's
	// tmpfs as its /dev/shm (the agent itself, mps.Launch); empty starts daemons without one (mps.Config).
	MPSLauncher string
	// MPSShmSize caps each MPS GPU's /dev/shm tmpfs in bytes (0: mps.DefaultShmSize).
	MPSShmSize int64
	// SchedulerRoot holds the shim scheduler socket of each GPU whose sharing has oversubscription
	// (<root>/<uuid>/gpushare.sock); empty runs no scheduler, and such a sharing fails to apply.
	SchedulerRoot string
	// OversubReserve is the GPU memory left out of an oversubscription budget the policy does not set
	// (default node.DefaultOversubReserve).
	OversubReserve uint64
	// ContextReserve is the device memory charged to each CUDA process of a sized claim for its context
	// (bytes; --context-reserve, default dra.DefaultContextReserve; zero charges nothing): a claim of M
	// bytes bounds what its pods' processes hold as NVML counts it, contexts included, so an MPS client's
	// pinned limit is M less this, and the shim's ledger keeps a claim's allocations within M less this
	// per process (docs/dra.md).
	ContextReserve int64
	// MPSServerMemory is the device memory an MPS GPU's server holds itself, left out of what its sized
	// device offers claims (--mps-server-memory; zero leaves nothing out).
	MPSServerMemory uint64
	// ShimGuards limit each shim client (frame deadline, connection caps, EVICT deadline, the context
	// overhead left out of the NVML check); zero fields take the scheduler's defaults. The agent sets
	// their sources itself (shimguards.go).
	ShimGuards scheduler.Guards
	// StateDir holds the agent's runtime state; it must not outlive a reboot.
	StateDir string
	// MPSControl and NvidiaSMI are the host tools' paths.
	MPSControl, NvidiaSMI string
	// Runner runs the host tools; nil means runner.Exec.
	Runner runner.Runner
	// Resync is how often the GPUs are checked when nothing else triggers a pass.
	Resync time.Duration
	// MPSExclusiveProcess sets EXCLUSIVE_PROCESS compute mode on MPS GPUs.
	MPSExclusiveProcess bool
	// SkipNameValidation lets several agents run in one process (the demo's simulated nodes).
	SkipNameValidation bool
	// ProcRoot is the host's proc filesystem, where shim clients' cgroups name their pods; empty leaves
	// the pod of shim clients unnamed.
	ProcRoot string
	// Health configures the NVML event (Xid) watcher; nil runs none and every GPU counts as healthy.
	Health *HealthOptions
	// Accounting configures the per-pod accounting (agent/accounting); nil runs none.
	Accounting *AccountingOptions
	// ClaimStatusInterval is how often the use of a prepared sized claim whose figures moved less than
	// the thresholds is written into its status.devices (--claim-status-interval; zero:
	// dra.DefaultDeviceStatusInterval; negative: no claim's device status is written). It needs the
	// kubelet plugin and the accounting.
	ClaimStatusInterval time.Duration
	// Clock is the agent's one clock: drain start and retry times, the drain's polls and timeout, MPS
	// restart backoff, health timestamps, pod-name relists and the shim schedulers' quanta. Nil means
	// the real clock; tests pass a testing clock.
	Clock clock.WithTickerAndDelayedExecution

	// DevicePlugin, when set, serves the kubelet device plugin API for the GPUs as their GPUNode status
	// describes them; nil turns it off (the demo's simulated nodes have no kubelet). Its MPSRoot must be
	// empty or equal MPSRoot: pods mount the pipe directory the MPS daemons use, both derived from MPSRoot.
	DevicePlugin *share.Config
	// ResourceSlices publishes the applied sharing as DRA ResourceSlices of driver gpu.gpusharing.io
	// (docs/dra.md), and makes the drain of a GPU wait for the pods holding ResourceClaims on it.
	ResourceSlices bool
	// Shares is how GPUs are cut into shares and which host paths they mount (the device plugin's
	// configuration) for DRA where DevicePlugin is nil; zero fields take the defaults.
	Shares share.Config
	// DRAPlugin, when set, serves the DRA kubelet plugin that prepares the claims allocated from those
	// slices (CDI specs with what the device plugin's Allocate gives); it needs ResourceSlices.
	DRAPlugin *dra.PluginConfig
	// PodResourcesSocket is the kubelet's PodResources API. With DevicePlugin set, it turns on the drain
	// of a GPU before a disruptive change (ResourceSlices turns it on too, from the ResourceClaims); with
	// neither, a disruptive change is applied at once and refused with GPUBusy while processes use the GPU.
	PodResourcesSocket string
	// DrainPollInterval is how often a drain looks at the kubelet again (default vacate.DefaultPollInterval).
	DrainPollInterval time.Duration
	// InFlightGrace is how long, where the device plugin serves beside the DRA kubelet plugin, a device
	// plugin Allocate holds its GPU against claims before the kubelet's PodResources shows its pod
	// (default owner.DefaultInFlightGrace).
	InFlightGrace time.Duration
	// DrainBackoff is the first wait before a GPU whose drain failed is drained again for the same
	// desired sharing; it doubles per failure up to node.DefaultDrainBackoffMax (default node.DefaultDrainBackoff).
	DrainBackoff time.Duration
}

// HealthOptions configure GPU health checks from NVML events.
type HealthOptions struct {
	// Disabled registers no events (health checks off).
	Disabled bool
	// IgnoredXids replaces the application-caused Xids that do not make a GPU unhealthy; nil keeps
	// health.DefaultIgnoredXids.
	IgnoredXids []uint64
}

// CacheOptions make the manager cache only this node's GPUNode and Node: thousands of agents must not
// each watch every node.
func CacheOptions(nodeName string) cache.Options {
	mine := fields.OneTermEqualSelector("metadata.name", nodeName)
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.GPUNode{}: {Field: mine},
		&corev1.Node{}:      {Field: mine},
	}}
}

// Setup adds the MPS daemon watcher and the GPUNode reconciler to mgr.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.NodeName == "" {
		return fmt.Errorf("the node name is required")
	}
	run := o.Runner
	if run == nil {
		run = runner.Exec{}
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	wake, notify := wakeup()
	agentMetrics, schedMetrics, err := registerMetrics()
	if err != nil {
		return err
	}
	mpsMgr := mps.New(mps.Config{Control: o.MPSControl, Root: o.MPSRoot, Launcher: o.MPSLauncher, ShmSize: o.MPSShmSize, Runner: run, Notify: notify, Clock: o.Clock})
	if err := mgr.Add(runnable(mpsMgr.Run)); err != nil {
		return err
	}
	pods := podResolver(mgr, o)
	shim, err := setupShim(mgr, o, schedMetrics, pods, notify)
	if err != nil {
		return err
	}
	hw, err := setupHealth(mgr, o, notify)
	if err != nil {
		return err
	}
	r := &node.Reconciler{
		Client:             mgr.GetClient(),
		Live:               mgr.GetAPIReader(),
		NodeName:           o.NodeName,
		Recorder:           mgr.GetEventRecorder("gpusharing-agent"),
		Metrics:            agentMetrics,
		Resync:             o.Resync,
		Wake:               wake,
		Notify:             func() { notify("") },
		SkipNameValidation: o.SkipNameValidation,
		Health:             healthSource(hw),
		PodNames:           podNames(pods),
		DrainBackoff:       o.DrainBackoff,
		Clock:              o.Clock,
		MPSServerMemory:    o.MPSServerMemory,
		Strategies: node.Strategies{
			GPU:                 o.GPU,
			MIG:                 &mig.Applier{GPU: o.GPU},
			MPS:                 mpsMgr,
			TimeSlice:           &timeslice.Manager{SMI: o.NvidiaSMI, StateDir: filepath.Join(o.StateDir, "timeslice"), Runner: run},
			MPSExclusiveProcess: o.MPSExclusiveProcess,
			Shim:                shim,
		},
	}
	podResources, err := dialPodResources(mgr, o)
	if err != nil {
		return err
	}
	owners, err := bothOwners(o, podResources)
	if err != nil {
		return err
	}
	if err := setupDevicePlugin(mgr, o, r, podResources, owners); err != nil {
		return err
	}
	if err := setupMPSNamespaces(mgr, o, podResources); err != nil {
		return err
	}
	if err := setupResourceSlices(mgr, o, r, owners); err != nil {
		return err
	}
	if err := watchOwners(mgr, o, owners, r); err != nil {
		return err
	}
	if shim != nil && pods != nil && r.Claims != nil {
		// A sized claim's processes on a shim GPU share one memory ledger (scheduler/ledger.go).
		shim.Guards.ClaimOf = claimLedgers(r.Claims, pods.ProcRoot, pods)
	}
	if shim != nil {
		// Only processes of pods holding a share of a GPU (and host processes) use its scheduler (shareguard.go).
		var claims gpuClaims
		if p, ok := r.Claims.(*dra.KubeletPlugin); ok {
			claims = p
		}
		var lister deviceplugin.PodResourcesLister
		if podResources != nil {
			lister = podResources
		}
		shim.Guards.Admit = admitGuard(mgr, o, pods, lister, claims)
		shim.Guards.OnStallRevoked = stallEvents(mgr, o, pods)
	}
	if err := setupDrain(mgr, o, r, podResources); err != nil {
		return err
	}
	if err := setupAccounting(mgr, o, r, shim, pods); err != nil {
		return err
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the GPUNode reconciler: %w", err)
	}
	return nil
}

// wakeup is how the MPS manager (daemon deaths, client changes), the shim schedulers and the health
// watcher wake the reconciler between passes, so the status shows what they saw without waiting for
// the resync. notify never blocks: a full channel means a pass is already queued.
func wakeup() (chan event.GenericEvent, func(string)) {
	wake := make(chan event.GenericEvent, 1)
	return wake, func(string) {
		select {
		case wake <- event.GenericEvent{Object: &v1alpha1.GPUNode{}}:
		default:
		}
	}
}

// registerMetrics registers one set of agent and scheduler series per process, labelled by node and
// GPU: the agents of one process (the demo) share what the first registered.
func registerMetrics() (*node.Metrics, *scheduler.Metrics, error) {
	agentMetrics, err := node.NewMetrics(metrics.Registry)
	if err != nil {
		return nil, nil, fmt.Errorf("registering the agent's metrics: %w", err)
	}
	schedMetrics, err := scheduler.NewMetrics(metrics.Registry)
	if err != nil {
		return nil, nil, fmt.Errorf("registering the shim scheduler's metrics: %w", err)
	}
	return agentMetrics, schedMetrics, nil
}

// setupShim adds the shim's per-GPU schedulers when o.SchedulerRoot is set (nil otherwise). Clients
// connecting and leaving wake a pass through notify, which publishes them: no polling of the schedulers.
func setupShim(mgr ctrl.Manager, o Options, m *scheduler.Metrics, pods *podpid.Resolver, notify func(string)) (*node.ShimSchedulers, error) {
	if o.SchedulerRoot == "" {
		return nil, nil
	}
	reserve := o.OversubReserve
	if reserve == 0 {
		reserve = node.DefaultOversubReserve
	}
	shim := &node.ShimSchedulers{Root: o.SchedulerRoot, Reserve: reserve, Headroom: node.DefaultOversubHeadroom, Metrics: m, Clock: o.Clock,
		Notify: func() { notify("") }, Guards: shimGuards(o, pods)}
	if err := mgr.Add(runnable(shim.Run)); err != nil {
		return nil, err
	}
	return shim, nil
}

// setupHealth adds the health watcher where the GPU source gives events (nil otherwise). It waits on
// NVML events (critical Xids) in its own goroutine and wakes a pass when a GPU turns unhealthy; the
// pass publishes Healthy=False and the device plugin stops advertising it.
func setupHealth(mgr ctrl.Manager, o Options, notify func(string)) (*health.Watcher, error) {
	src, ok := o.GPU.(health.Source)
	if !ok || o.Health == nil {
		return nil, nil
	}
	hw := health.New(health.Config{Source: src, Disabled: o.Health.Disabled, IgnoredXids: o.Health.IgnoredXids, Notify: notify, Clock: o.Clock})
	hlog := mgr.GetLogger().WithName("health")
	if err := mgr.Add(runnable(func(ctx context.Context) error { return hw.Run(ctrl.LoggerInto(ctx, hlog)) })); err != nil {
		return nil, err
	}
	return hw, nil
}

// DevicePluginConfig is the device plugin configuration Setup uses: cfg with its MPS root taken from
// mpsRoot, the one root the MPS daemons use too, so a pod's mount is the daemon's pipe directory, and its
// scheduler root from schedulerRoot (when set), the one the agent's shim schedulers listen under, so a
// pod's GPUSHARE_SOCKET is where its GPU's scheduler is.
func DevicePluginConfig(cfg share.Config, mpsRoot, schedulerRoot string) (share.Config, error) {
	if cfg.MPSRoot != "" && filepath.Clean(cfg.MPSRoot) != filepath.Clean(mpsRoot) {
		return cfg, fmt.Errorf("the device plugin's MPS root %q differs from the MPS daemons' %q: pods would mount a pipe directory no daemon uses", cfg.MPSRoot, mpsRoot)
	}
	cfg.MPSRoot = mpsRoot
	if schedulerRoot == "" {
		return cfg, nil
	}
	if cfg.SchedulerRoot != "" && filepath.Clean(cfg.SchedulerRoot) != filepath.Clean(schedulerRoot) {
		return cfg, fmt.Errorf("the device plugin's scheduler root %q differs from the shim schedulers' %q: pods would connect to a socket no scheduler listens on", cfg.SchedulerRoot, schedulerRoot)
	}
	cfg.SchedulerRoot = schedulerRoot
	return cfg, nil
}

// setupResourceSlices makes r publish each status as the node's ResourceSlices, named as the device
// plugin names its shares, and serves the DRA kubelet plugin. The slices are published by the
// ResourceSlice controller of k8s.io/dynamic-resource-allocation, with its own informer on the node's
// slices (the agent's cache holds its own node's objects only), whether or not the kubelet plugin runs.
func setupResourceSlices(mgr ctrl.Manager, o Options, r *node.Reconciler, owners *owner.Owners) error {
	if !o.ResourceSlices {
		if o.DRAPlugin != nil {
			return fmt.Errorf("the DRA kubelet plugin needs the ResourceSlices it prepares claims from")
		}
		return nil
	}
	// Zero fields take the device plugin's defaults; the roots are the agent's.
	cfg := o.Shares
	if o.DevicePlugin != nil {
		cfg = *o.DevicePlugin
	}
	// The kubelet plugin mounts what the device plugin would: the same MPS and scheduler roots.
	cfg, err := DevicePluginConfig(cfg, o.MPSRoot, o.SchedulerRoot)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("building the DRA client: %w", err)
	}
	sliceMetrics, err := dra.NewSliceMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("registering the ResourceSlice metrics: %w", err)
	}
	pub, err := dra.NewPublisher(dra.PublisherOptions{Node: o.NodeName, Kube: kube, Shares: cfg,
		Log: mgr.GetLogger().WithName("resourceslices"), Metrics: sliceMetrics, Events: mgr.GetEventRecorder("gpusharing-agent"),
		Withheld: withheld(owners)})
	if err != nil {
		return err
	}
	if err := mgr.Add(pub); err != nil {
		return err
	}
	d := &dra.Driver{Slices: pub}
	r.Slices = d
	if o.DRAPlugin == nil {
		return nil
	}
	log := mgr.GetLogger().WithName("dra-plugin")
	pcfg := *o.DRAPlugin
	pcfg.ContextReserve = o.ContextReserve
	if d.Plugin, err = dra.NewKubeletPlugin(o.NodeName, pcfg, cfg, log); err != nil {
		return err
	}
	claimMetrics, err := dra.NewClaimMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("registering the sized claims' metrics: %w", err)
	}
	claimMetrics.Add(o.NodeName, d.Plugin)
	r.Claims = d.Plugin
	if g, ok := o.GPU.(dra.MIGGPU); ok {
		// Dynamic MIG: the plugin creates instances for claims, the layout applier leaves them alone.
		m, err := dra.NewDynamicMIG(o.DRAPlugin.WithDefaults().PluginDir, g, log.WithName("mig"))
		if err != nil {
			return err
		}
		d.Plugin.MIG, r.MIGClaims, r.Strategies.ClaimedMIG = m, m, m
		if hw, ok := r.Health.(*health.Watcher); ok {
			// An Xid on a claim's instance marks that instance alone, until it is destroyed.
			hw.ScopeInstances(m.Holds)
			m.OnDestroy = hw.ForgetInstance
		}
	}
	d.Plugin.OnChange = r.Notify
	if owners != nil {
		// Beside the device plugin, a GPU goes to whichever interface holds it first (bothmode.go).
		d.Plugin.SetOwners(owners)
	}
	// Each namespace's MPS claims on a GPU get a daemon of their own (docs/mps.md).
	if r.Strategies.MPS != nil {
		d.Plugin.MPS = r.Strategies.MPS
	}
	// The guard compares the plugin's reads of the claims with the accounting's reads of the GPUs.
	d.Plugin.Clock = o.Clock
	d.Plugin.PodPriority = claimPodPriority(mgr.GetAPIReader())
	return mgr.Add(runnable(func(ctx context.Context) error {
		h, err := d.Plugin.Start(ctrl.LoggerInto(ctx, log), kube)
		if err != nil {
			return fmt.Errorf("starting the DRA kubelet plugin: %w", err)
		}
		<-ctx.Done()
		h.Stop()
		return nil
	}))
}

// dialPodResources connects to the kubelet's PodResources API where the device plugin runs: the drain
// finds a GPU's pods there, and the device plugin which devices of a cordoned GPU pods still hold. Nil
// where there is no device plugin or no socket.
func dialPodResources(mgr ctrl.Manager, o Options) (podresourcesv1.PodResourcesListerClient, error) {
	if o.DevicePlugin == nil || o.PodResourcesSocket == "" {
		return nil, nil
	}
	lister, closeLister, err := vacate.DialPodResources(o.PodResourcesSocket)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(runnable(func(ctx context.Context) error { <-ctx.Done(); return closeLister() })); err != nil {
		return nil, err
	}
	return lister, nil
}

// setupMPSNamespaces names the GPUs whose device plugin MPS shares pods of several namespaces hold
// (mpsnamespaces.go), where the device plugin serves and the kubelet's PodResources can be read.
func setupMPSNamespaces(mgr ctrl.Manager, o Options, podResources podresourcesv1.PodResourcesListerClient) error {
	if o.DevicePlugin == nil || podResources == nil {
		return nil
	}
	w := &mpsNamespaces{lister: podResources, resource: o.DevicePlugin.WithDefaults().Resources.MPS,
		events: mgr.GetEventRecorder("gpusharing-agent"), node: o.NodeName, log: mgr.GetLogger().WithName("mps-namespaces")}
	return mgr.Add(runnable(func(ctx context.Context) error { return w.run(ctx, o.Clock) }))
}

// setupDrain gives r a Vacater where something lists a GPU's pods: the kubelet's PodResources for the
// device plugin's pods, the ResourceClaims for DRA's.
func setupDrain(mgr ctrl.Manager, o Options, r *node.Reconciler, podResources podresourcesv1.PodResourcesListerClient) error {
	d := &vacate.Vacater{Pods: mgr.GetAPIReader(), NodeName: o.NodeName, PollInterval: o.DrainPollInterval, Clock: o.Clock, PodResources: podResources}
	if o.ResourceSlices {
		// Claims are read uncached, like pods: the agent must not cache every claim of the cluster.
		d.Claims = dra.ClaimHolders{Reader: mgr.GetAPIReader(), Node: o.NodeName}
	}
	if d.PodResources == nil && d.Claims == nil {
		return nil
	}
	evictor, err := vacate.NewEvictor(mgr.GetConfig())
	if err != nil {
		return err
	}
	d.Evictor = evictor
	r.Vacater = d
	r.ClaimEvictor = evictor
	return nil
}

// setupDevicePlugin adds the device plugin to r.
func setupDevicePlugin(mgr ctrl.Manager, o Options, r *node.Reconciler, podResources podresourcesv1.PodResourcesListerClient, owners *owner.Owners) error {
	if o.DevicePlugin == nil {
		return nil
	}
	cfg, err := DevicePluginConfig(*o.DevicePlugin, o.MPSRoot, o.SchedulerRoot)
	if err != nil {
		return err
	}
	dp, err := deviceplugin.NewManager(cfg)
	if err != nil {
		return err
	}
	dp.SetPodResources(podResources)
	if owners != nil {
		dp.SetOwners(owners)
	}
	if t, ok := o.GPU.(gpu.TopologyReader); ok {
		dp.SetTopology(t)
	}
	if o.ResourceSlices {
		// Beside DRA, the device plugin leaves the names DeviceClasses serve through DRA to it, and
		// advertises nothing before it knows them.
		dp.AwaitServedByDRA()
		w := &dra.DeviceClassWatch{Reader: mgr.GetClient(), Target: dp, SkipNameValidation: o.SkipNameValidation}
		if err := w.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("watching the DeviceClasses: %w", err)
		}
	}
	dpLog := mgr.GetLogger().WithName("device-plugin")
	if err := mgr.Add(runnable(func(ctx context.Context) error { return dp.Run(ctrl.LoggerInto(ctx, dpLog)) })); err != nil {
		return err
	}
	r.Devices = dp
	return nil
}

// podNames names shim clients' pods from their cgroups and this node's pods, read uncached so the agent
// does not cache every pod of the cluster. Only where schedulers run, and never for the demo's simulated
// nodes, whose "clients" are not in pods.
func podNames(r *podpid.Resolver) func([]int32) map[int32]string {
	if r == nil {
		return nil
	}
	return func(pids []int32) map[int32]string { return r.Names(context.Background(), pids) }
}

// healthSource keeps a nil watcher a nil interface, so the reconciler sees "nothing watches".
func healthSource(hw *health.Watcher) node.HealthSource {
	if hw == nil {
		return nil
	}
	return hw
}

// runnable adapts a func to a controller-runtime Runnable.
type runnable func(context.Context) error

func (f runnable) Start(ctx context.Context) error { return f(ctx) }
