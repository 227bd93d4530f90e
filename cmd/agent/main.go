// Command agent is gpusharing's node agent. Run without a subcommand it converges this node's GPUs to
// its GPUNode and publishes their status; `agent inventory` prints what NVML reports and `agent plan`
// plans MIG layouts against the real GPU's profiles, both read-only; `agent install-shim` installs the shim
// library on the host without disturbing processes that loaded an earlier one.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/resource"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/app"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// options are every flag and environment variable the agent reads, parsed once here.
type options struct {
	nodeName            string
	procRoot            string
	hostRoot            string
	driverRoot          string
	mpsRoot             string
	mpsShmSize          int64
	stateDir            string
	nvmlLib             string
	mpsControl          string
	nvidiaSMI           string
	resync              time.Duration
	mpsExclusiveProcess bool
	metricsAddr         string
	probeAddr           string
	// devicePlugin is nil when --device-plugin=false.
	devicePlugin       *share.Config
	podResourcesSocket string
	resourceSlices     bool
	// shares is how the device plugin would cut GPUs into shares and which host paths they mount; DRA
	// uses it also where the device plugin is off.
	shares share.Config
	// draPlugin is nil unless --dra.
	draPlugin    *dra.PluginConfig
	drainBackoff time.Duration
	drainPoll    time.Duration
	// schedulerRoot holds the shim scheduler sockets, whether or not the device plugin runs.
	schedulerRoot  string
	oversubReserve uint64
	// contextReserve is charged to each CUDA process of a sized claim (app.Options.ContextReserve).
	contextReserve int64
	// mpsServerMemory is left out of an MPS GPU's sized capacity (app.Options.MPSServerMemory).
	mpsServerMemory uint64
	// shimGuards limit the shim's clients (docs/agent.md).
	shimGuards scheduler.Guards
	// health configures the NVML Xid watcher.
	health app.HealthOptions
	// accounting configures the per-pod accounting; its Interval 0 turns it off.
	accounting app.AccountingOptions
	// simulate, when set, replaces NVML and the driver tools with simulated ones (simulate.go).
	simulate *simulateFlag
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "inventory":
			os.Exit(runInventory(os.Args[2:]))
		case "plan":
			os.Exit(runPlan(os.Args[2:]))
		case "install-shim":
			os.Exit(runInstallShim(os.Args[2:]))
		case mps.LaunchCommand:
			// Started by the agent itself for each MPS daemon; it returns only on failure.
			err := mps.Launch(os.Args[2:], os.Environ())
			fmt.Fprintf(os.Stderr, "%s: %v\n", mps.LaunchCommand, err)
			os.Exit(1)
		}
	}
	o, logConfig := parse(os.Args[1:])
	ctrl.SetLogger(textlogger.NewLogger(logConfig))
	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		ctrl.Log.Error(err, "Agent stopped")
		os.Exit(1)
	}
}

func parse(args []string) (options, *textlogger.Config) {
	var o options
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name, which is also its GPUNode's (default $NODE_NAME)")
	fs.StringVar(&o.procRoot, "proc-root", "/proc", "the host's proc filesystem, where each GPU process's cgroup names its pod (the DaemonSet shares the host's PID namespace; an agent that does not mounts the host's /proc elsewhere and names it here)")
	fs.StringVar(&o.hostRoot, "host-root", "/run/gpusharing", "the agent's directory on the host (a hostPath); every host path the agent writes is under it unless named below")
	fs.StringVar(&o.driverRoot, "driver-root", "/", "where the NVIDIA driver's tools are installed; nvidia-smi and nvidia-cuda-mps-control are looked up under it, then in $PATH")
	fs.StringVar(&o.mpsRoot, "mps-root", "", "directory holding each MPS GPU's pipe and log directories and /dev/shm tmpfs, <root>/<uuid>/{pipe,log,shm} (default <host-root>/mps)")
	fs.StringVar(&o.stateDir, "state-dir", "", "directory for runtime state (the time-slicing in force); must not outlive a reboot (default <host-root>/state)")
	fs.StringVar(&o.nvmlLib, "nvml-lib", "", "path of libnvidia-ml.so.1 (default: the dynamic loader's search)")
	fs.StringVar(&o.mpsControl, "mps-control", "", "path of nvidia-cuda-mps-control (default: found under --driver-root)")
	fs.StringVar(&o.nvidiaSMI, "nvidia-smi", "", "path of nvidia-smi (default: found under --driver-root)")
	fs.DurationVar(&o.resync, "resync", 30*time.Second, "how often the GPUs are checked when nothing else triggers a pass")
	shmSize := resource.NewQuantity(mps.DefaultShmSize, resource.BinarySI)
	fs.Func("mps-shm-size", fmt.Sprintf("size cap of the tmpfs each MPS GPU's daemon and client containers get as /dev/shm; room for PyTorch DataLoader workers, which pass batches through /dev/shm (default %s)", shmSize), func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("want a positive quantity such as 2Gi")
		}
		shmSize = &q
		return nil
	})
	fs.BoolVar(&o.mpsExclusiveProcess, "mps-exclusive-process", false, "set EXCLUSIVE_PROCESS compute mode on MPS GPUs")
	fs.DurationVar(&o.accounting.Interval, "accounting-interval", accounting.DefaultInterval, "how often each GPU's processes are read for the per-pod memory and utilization (metrics and status.gpus[].usage); 0 turns the accounting off")
	fs.IntVar(&o.accounting.MaxSeriesPerGPU, "accounting-max-series-per-gpu", accounting.DefaultMaxSeriesPerGPU, "most containers a GPU exports per-pod series for; the rest are counted in gpusharing_pod_series_omitted")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8081", "metrics endpoint address (0 disables)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8082", "health probe address")
	dp := share.DefaultConfig()
	var dpOn bool
	reserve := resource.NewQuantity(node.DefaultOversubReserve, resource.BinarySI)
	var draOn bool
	draCfg := dra.PluginConfig{}.WithDefaults()
	fs.BoolVar(&draOn, "dra", false, "serve this node's GPUs through Dynamic Resource Allocation: publish ResourceSlices (driver gpu.gpusharing.io) and serve the DRA kubelet plugin that prepares claims through CDI (docs/dra.md); with --device-plugin both run side by side")
	fs.BoolVar(&o.resourceSlices, "dra-resource-slices", false, "publish the ResourceSlices without serving the DRA kubelet plugin (--dra does both)")
	fs.StringVar(&draCfg.PluginDir, "dra-plugin-dir", draCfg.PluginDir, "the DRA kubelet plugin's directory: its gRPC socket dra.sock, its checkpoint of prepared claims and its ledger of dynamic MIG instances (dynmig.json)")
	fs.StringVar(&draCfg.RegistryDir, "dra-registry-dir", draCfg.RegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&draCfg.CDIDir, "cdi-dir", draCfg.CDIDir, "where the DRA kubelet plugin writes the CDI specs of prepared claims; the container runtime must read CDI specs there")
	fs.BoolVar(&dpOn, "device-plugin", true, "serve the kubelet device plugin API for this node's GPUs (and drain a GPU before a disruptive change)")
	fs.StringVar(&dp.SocketDir, "device-plugin-dir", dp.SocketDir, "the kubelet's device plugin directory (kubelet.sock and the plugins' sockets)")
	fs.StringVar(&o.podResourcesSocket, "pod-resources-socket", vacate.DefaultPodResourcesSocket, "the kubelet's PodResources API socket, to find the pods using a GPU before a disruptive change; empty turns the drain off")
	fs.DurationVar(&o.drainPoll, "drain-poll-interval", vacate.DefaultPollInterval, "how often a drain lists the kubelet's PodResources again (it has no watch): bounds how long a GPU stays cordoned after its last pod ends")
	fs.DurationVar(&o.drainBackoff, "drain-backoff", node.DefaultDrainBackoff, "first wait before a GPU whose drain timed out or failed is drained again for the same desired sharing (doubles per failure, up to 1h)")
	resourceFlag(fs, &dp.Resources.Exclusive, "resource-exclusive", "resource name of a whole GPU")
	resourceFlag(fs, &dp.Resources.TimeSlicing, "resource-timeslice", "resource name of one replica of a time-sliced GPU")
	resourceFlag(fs, &dp.Resources.MPS, "resource-mps", "resource name of one MPS share of a GPU")
	resourceFlag(fs, &dp.Resources.Shared, "resource-shared", "resource name of one share of a GPU scheduled by the shim")
	fs.StringVar(&dp.Resources.MIGPrefix, "resource-mig-prefix", dp.Resources.MIGPrefix, "prefix of MIG resource names; the profile follows (nvidia.com/mig-1g.10gb)")
	fs.StringVar(&o.schedulerRoot, "scheduler-root", "", "directory holding each shim-shared GPU's scheduler socket, <root>/<uuid>/gpushare.sock (default <host-root>/scheduler)")
	fs.Func("oversub-reserve", fmt.Sprintf("GPU memory left out of an oversubscription budget the policy does not set: CUDA contexts and memory the shim cannot swap live outside the budget (default %s)", reserve), func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() < 0 {
			return fmt.Errorf("want a non-negative quantity such as 2Gi")
		}
		reserve = &q
		return nil
	})
	ctxReserve := memoryFlag(fs, "context-reserve", dra.DefaultContextReserve, "device memory charged to each CUDA process of a sized claim for its context, which NVML counts and allocation limits do not: an MPS client's pinned limit is its claim less this, and the shim keeps a claim's allocations within the claim less this per process")
	mpsServer := memoryFlag(fs, "mps-server-memory", node.DefaultMPSServerMemory, "device memory an MPS server holds itself, left out of what an MPS GPU sized per claim offers claims")
	fs.DurationVar(&o.shimGuards.FrameTimeout, "shim-frame-timeout", scheduler.DefaultFrameTimeout, "longest a shim client may take to finish a message it started before it is dropped")
	fs.IntVar(&o.shimGuards.MaxConns, "shim-max-conns", scheduler.DefaultMaxConns, "most connections one GPU's scheduler socket accepts at once")
	fs.IntVar(&o.shimGuards.MaxConnsPerPeer, "shim-max-conns-per-pod", scheduler.DefaultMaxConnsPerPeer, "most connections one pod (one process where the pod is unknown) may hold on one GPU's scheduler socket")
	fs.DurationVar(&o.shimGuards.EvictTimeout, "shim-evict-timeout", scheduler.DefaultEvictTimeout, "longest a shim client may take to answer an eviction before it is dropped to pass-through and its memory leaves the budget")
	// One figure for what a CUDA context holds beyond allocations: unset, the residency check leaves
	// out the same context reserve the claims are charged (--context-reserve).
	var shimOverhead *resource.Quantity
	fs.Func("shim-context-overhead", "device memory of a shim process NVML reports beyond its allocations (CUDA context, driver); left out when its reported residency is checked against NVML (default: --context-reserve)", func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() < 0 {
			return fmt.Errorf("want a non-negative quantity such as 1Gi")
		}
		shimOverhead = &q
		return nil
	})
	fs.StringVar(&dp.ShimLibrary, "shim-library", dp.ShimLibrary, "host path of libgpushare.so, mounted into shim-shared containers")
	shimReplicas := fs.Int("shim-replicas", int(dp.ShimReplicas), "shares an Exclusive GPU with oversubscription is cut into")
	healthChecks := fs.Bool("health-checks", true, "watch NVML events and report a GPU with a critical Xid unhealthy (its devices are then not advertised)")
	fs.Func("health-ignored-xids", fmt.Sprintf("comma-separated Xids caused by applications, which leave a GPU healthy (default %s)", health.FormatXids(health.DefaultIgnoredXids)), func(s string) error {
		xids, err := health.ParseXids(s)
		o.health.IgnoredXids = xids
		return err
	})
	var sim simulateFlag
	fs.StringVar(&sim.stateFile, "simulate-gpus-state", "", "with --simulate-gpus: a file the simulated GPUs' MIG mode, instances and compute mode are kept in, so a restarted agent finds them as the one before it left them (as real GPUs outlive the agent); mutations are journaled in FILE.journal")
	fs.IntVar(&sim.pauseAfter, "simulate-gpus-pause-after", 0, "with --simulate-gpus-state: stop for good after this process's n-th GPU mutation, once it is written, and create FILE.paused (tests kill the agent there)")
	fs.Var(&sim, "simulate-gpus", "MODEL:COUNT[:SEQ] (H100 or A100, 1-8 GPUs): run over a simulated DGX with stand-in driver tools instead of NVML, for tests on machines without a GPU (the real-node e2e); never on a real node")
	logConfig := textlogger.NewConfig()
	logConfig.AddFlags(fs)
	_ = fs.Parse(args)
	o.health.Disabled = !*healthChecks
	if sim.configured {
		o.simulate = &sim
	}
	if draOn {
		o.resourceSlices = true
		o.draPlugin = &draCfg
	}
	if o.schedulerRoot == "" {
		o.schedulerRoot = filepath.Join(o.hostRoot, "scheduler")
	}
	o.oversubReserve = uint64(reserve.Value())
	o.contextReserve = (*ctxReserve).Value()
	// One reserve for both halves of a claim's accounting: the kubelet plugin's MPS limits and the
	// schedulers' ledgers.
	o.shimGuards.ContextReserve = uint64(o.contextReserve)
	o.mpsServerMemory = uint64((*mpsServer).Value())
	o.mpsShmSize = shmSize.Value()
	// The device plugin names the sockets the agent's schedulers listen on: one root for both.
	dp.SchedulerRoot = o.schedulerRoot
	dp.ShimReplicas = int32(*shimReplicas)
	// The MPS root is not a device plugin flag: app.Setup takes it from --mps-root, the daemons' root.
	dp.MPSRoot = ""
	// DRA cuts and mounts shares as the device plugin does, whether or not the device plugin runs.
	o.shares = dp
	o.shimGuards.ContextOverhead = uint64(o.contextReserve)
	if shimOverhead != nil {
		o.shimGuards.ContextOverhead = uint64(shimOverhead.Value())
	}
	if dpOn {
		o.devicePlugin = &dp
	}
	if o.mpsRoot == "" {
		o.mpsRoot = filepath.Join(o.hostRoot, "mps")
	}
	if o.stateDir == "" {
		o.stateDir = filepath.Join(o.hostRoot, "state")
	}
	if o.mpsControl == "" && o.simulate == nil {
		o.mpsControl = driverTool(o.driverRoot, "nvidia-cuda-mps-control")
	}
	if o.nvidiaSMI == "" && o.simulate == nil {
		o.nvidiaSMI = driverTool(o.driverRoot, "nvidia-smi")
	}
	return o, logConfig
}

// memoryFlag binds a non-negative memory quantity flag with its default; the result is read after Parse.
func memoryFlag(fs *flag.FlagSet, name string, def int64, usage string) **resource.Quantity {
	q := resource.NewQuantity(def, resource.BinarySI)
	fs.Func(name, fmt.Sprintf("%s (default %s)", usage, q), func(s string) error {
		v, err := resource.ParseQuantity(s)
		if err != nil || v.Sign() < 0 {
			return fmt.Errorf("want a non-negative quantity such as %s", q)
		}
		q = &v
		return nil
	})
	return &q
}

// resourceFlag binds a resource name flag.
func resourceFlag(fs *flag.FlagSet, v *share.ResourceName, name, usage string) {
	fs.Func(name, fmt.Sprintf("%s (default %s)", usage, *v), func(s string) error {
		*v = share.ResourceName(s)
		return nil
	})
}

// driverTool finds a driver tool under the driver root, where driver installs put it, then in $PATH
// (where the NVIDIA container toolkit injects it into the agent's container).
func driverTool(root, name string) string {
	for _, dir := range []string{"usr/bin", "usr/local/nvidia/bin", "usr/local/bin", "bin"} {
		p := filepath.Join(root, dir, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := runner.LookPath(name); err == nil {
		return p
	}
	return filepath.Join(root, "usr/bin", name)
}

// openGPUs initializes NVML, falling back to the null implementation (and a Ready=False condition)
// when the node has no NVML: a GPU-less node or a broken driver must not crash-loop the agent.
func openGPUs(libPath string) (gpu.Interface, func()) {
	var opts []nvml.LibraryOption
	if libPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libPath))
	}
	lib := nvml.New(opts...)
	if r := lib.Init(); r != nvml.SUCCESS {
		return gpu.Null{Cause: fmt.Errorf("nvmlInit: %s", r.Error())}, func() {}
	}
	return gpu.NewNVML(lib), func() { _ = lib.Shutdown() }
}

func run(ctx context.Context, o options) error {
	log := ctrl.Log.WithName("agent")
	if o.nodeName == "" {
		return fmt.Errorf("--node-name (or NODE_NAME) is required")
	}
	if o.devicePlugin != nil {
		if err := o.devicePlugin.Validate(); err != nil {
			return err
		}
	}
	var gpus gpu.Interface
	if o.simulate != nil {
		sim, server, err := simulatedGPUs(o.simulate, &o)
		if err != nil {
			return fmt.Errorf("--simulate-gpus: %w", err)
		}
		gpus = sim
		// Pods on the simulated GPUs may declare what they would use (nvmlmock.EnvSimulatedMemoryMiB), so
		// the per-pod accounting has processes to report on a machine without a GPU.
		go server.WatchHostProcesses(ctx, "/proc", simulatedProcessScan, func(err error) {
			log.Error(err, "Cannot scan the host's processes for simulated GPU use")
		})
		log.Info("Running over simulated GPUs (--simulate-gpus); no NVML or driver tool is used", "gpus", o.simulate.String())
	} else {
		nvmlGPUs, shutdown := openGPUs(o.nvmlLib)
		defer shutdown()
		gpus = nvmlGPUs
	}
	if _, isNull := gpus.(gpu.Null); isNull {
		log.Info("NVML is not available; publishing Ready=False NVMLUnavailable", "cause", gpus.(gpu.Null).Cause.Error())
	}

	// The agent starts each MPS daemon through its own mps-launch subcommand.
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the agent's executable for mps-launch: %w", err)
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme(),
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		Cache:                  app.CacheOptions(o.nodeName),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	err = app.Setup(mgr, app.Options{
		NodeName:       o.nodeName,
		GPU:            gpus,
		MPSRoot:        o.mpsRoot,
		MPSLauncher:    self,
		MPSShmSize:     o.mpsShmSize,
		SchedulerRoot:  o.schedulerRoot,
		OversubReserve: o.oversubReserve,
		ContextReserve: o.contextReserve,
		// What a sized MPS GPU's server holds itself.
		MPSServerMemory: o.mpsServerMemory,
		ShimGuards:      o.shimGuards,
		Health:          &o.health,
		Accounting:      accountingOptions(o.accounting),
		// hostPID: the agent's /proc is the host's, where the scheduler's client pids live.
		ProcRoot:            o.procRoot,
		StateDir:            o.stateDir,
		MPSControl:          o.mpsControl,
		NvidiaSMI:           o.nvidiaSMI,
		Resync:              o.resync,
		MPSExclusiveProcess: o.mpsExclusiveProcess,
		DevicePlugin:        o.devicePlugin,
		PodResourcesSocket:  o.podResourcesSocket,
		ResourceSlices:      o.resourceSlices,
		DRAPlugin:           o.draPlugin,
		Shares:              o.shares,
		DrainBackoff:        o.drainBackoff,
		DrainPollInterval:   o.drainPoll,
	})
	if err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	log.Info("Starting agent", "node", o.nodeName, "mpsRoot", o.mpsRoot, "mpsShmSize", o.mpsShmSize, "schedulerRoot", o.schedulerRoot, "oversubReserve", o.oversubReserve, "stateDir", o.stateDir, "mpsControl", o.mpsControl, "nvidiaSMI", o.nvidiaSMI,
		"devicePlugin", o.devicePlugin != nil, "podResourcesSocket", o.podResourcesSocket, "resourceSlices", o.resourceSlices, "draKubeletPlugin", o.draPlugin != nil)
	return mgr.Start(ctx)
}

func scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	utilruntime(clientgoscheme.AddToScheme(s))
	utilruntime(v1alpha1.AddToScheme(s))
	return s
}

func utilruntime(err error) {
	if err != nil {
		panic(err)
	}
}

// accountingOptions is nil, no accounting, for --accounting-interval=0.
func accountingOptions(o app.AccountingOptions) *app.AccountingOptions {
	if o.Interval <= 0 {
		return nil
	}
	return &o
}
