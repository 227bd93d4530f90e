package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2/textlogger"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/devnodes"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/vacate"
)

// parse reads the agent's flags into options; a bad value exits with its usage, as flag does.
func parse(args []string) (options, *textlogger.Config) {
	var o options
	v := flagValues{dp: share.DefaultConfig(), draCfg: dra.PluginConfig{}.WithDefaults(), nodes: devnodes.Defaults()}
	fs, logConfig := flagSet(&o, &v)
	_ = fs.Parse(args)
	v.apply(&o)
	return o, logConfig
}

// flagSet binds every flag of the agent to o and v: the flag set parse reads and docs/reference lists.
func flagSet(o *options, v *flagValues) (*flag.FlagSet, *textlogger.Config) {
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	bindNodeFlags(fs, o, v)
	bindShareFlags(fs, o, v)
	bindShimFlags(fs, o, v)
	logConfig := textlogger.NewConfig()
	logConfig.AddFlags(fs)
	return fs, logConfig
}

// flagValues hold what the flags set that becomes options only once every flag is parsed: defaults
// that follow other flags, the share configuration, switches.
type flagValues struct {
	dp                                                    share.Config
	dpOn, draOn                                           bool
	draCfg                                                dra.PluginConfig
	shmSize, reserve, ctxReserve, mpsServer, shimOverhead **resource.Quantity
	shimReplicas                                          *int
	healthChecks                                          *bool
	sim                                                   simulateFlag
	nodes                                                 devnodes.Host
	nodesOn                                               bool
}

// bindNodeFlags binds the node's paths and tools, the MPS daemons, accounting, endpoints, health and
// the simulated GPUs.
func bindNodeFlags(fs *flag.FlagSet, o *options, v *flagValues) {
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name, which is also its GPUNode's (default $NODE_NAME)")
	fs.StringVar(&o.procRoot, "proc-root", "/proc", "the host's proc filesystem, where each GPU process's cgroup names its pod (the DaemonSet shares the host's PID namespace; an agent that does not mounts the host's /proc elsewhere and names it here)")
	fs.StringVar(&o.hostRoot, "host-root", "/run/gpusharing", "the agent's directory on the host (a hostPath); every host path the agent writes is under it unless named below")
	fs.StringVar(&v.nodes.Dev, "dev-root", v.nodes.Dev, "host directory of the NVIDIA device nodes (nvidia<minor>, nvidiactl, nvidia-uvm, nvidia-caps/): the agent reads them there, at the same path as on the host, and every share reaches its container as these nodes (CDI device nodes, the device plugin's Devices)")
	fs.StringVar(&v.nodes.Proc, "device-proc-root", v.nodes.Proc, "proc filesystem the NVIDIA device majors (devices) and MIG capability minors (driver/nvidia-caps/mig-minors) are read from")
	fs.BoolVar(&v.nodesOn, "device-nodes", true, "hand every share to its container as the GPU's device nodes; false hands out only the environment, which a pod can override: only for nodes whose runtime injects no GPU (simulated GPUs without device nodes)")
	fs.StringVar(&o.driverRoot, "driver-root", "/", "where the NVIDIA driver's tools are installed; nvidia-smi and nvidia-cuda-mps-control are looked up under it, then in $PATH")
	fs.StringVar(&o.mpsRoot, "mps-root", "", "directory holding each MPS daemon's pipe and log directories and /dev/shm tmpfs: a GPU's in <root>/<uuid>/{pipe,log,shm}, a namespace's on that GPU in <root>/<uuid>/ns/<namespace>/{pipe,log,shm} (default <host-root>/mps)")
	fs.StringVar(&o.stateDir, "state-dir", "", "directory for runtime state (the time-slicing in force); must not outlive a reboot, as the driver's setting does not (default <host-root>/state)")
	fs.StringVar(&o.nvmlLib, "nvml-lib", "", "path of libnvidia-ml.so.1 (default: the dynamic loader's search)")
	fs.StringVar(&o.mpsControl, "mps-control", "", "path of nvidia-cuda-mps-control (default: found under --driver-root)")
	fs.StringVar(&o.nvidiaSMI, "nvidia-smi", "", "path of nvidia-smi (default: found under --driver-root)")
	fs.DurationVar(&o.resync, "resync", 30*time.Second, "how often the GPUs are checked when nothing else triggers a pass")
	v.shmSize = quantityFlag(fs, "mps-shm-size", resource.NewQuantity(mps.DefaultShmSize, resource.BinarySI), true, "size cap of the tmpfs each MPS GPU's daemon and client containers get as /dev/shm; room for PyTorch DataLoader workers, which pass batches through /dev/shm")
	fs.BoolVar(&o.mpsExclusiveProcess, "mps-exclusive-process", false, "set EXCLUSIVE_PROCESS compute mode on MPS GPUs (and Default again when they leave MPS), so a client that bypasses the MPS daemon cannot open an unlimited context")
	fs.DurationVar(&o.accounting.Interval, "accounting-interval", accounting.DefaultInterval, "how often each GPU's processes are read for the per-pod memory and utilization (metrics and status.gpus[].usage); 0 turns the accounting off")
	fs.DurationVar(&o.claimStatusInterval, "claim-status-interval", dra.DefaultDeviceStatusInterval, "how often the use of a prepared sized claim (status.devices[].data) is written when it moved less than the thresholds (256 MiB or 5 % of memory, 10 points of SM use; moves past them are written at once, at most every 15 s); 0 writes no claim's device status")
	fs.DurationVar(&o.accounting.UnmanagedGrace, "unmanaged-grace", guard.DefaultUnmanagedGrace, "how long a pod's process may hold a context on a shim or sized MPS GPU without being a client there before status, an event and gpusharing_unmanaged_processes name it (and sharing.unmanagedProcesses Evict evicts its pod)")
	fs.IntVar(&o.accounting.MaxSeriesPerGPU, "accounting-max-series-per-gpu", accounting.DefaultMaxSeriesPerGPU, "most containers a GPU exports per-pod series for; the rest are counted in gpusharing_pod_series_omitted")
	fs.StringVar(&o.metrics.BindAddress, "metrics-bind-address", ":8081", "metrics endpoint address (0 disables)")
	fs.BoolVar(&o.metrics.Secure, "metrics-secure", true, "serve metrics over HTTPS to callers the API server authenticates (TokenReview) and authorizes to get /metrics (SubjectAccessReview; the ClusterRole gpusharing-metrics-reader grants it); false serves plain HTTP to whoever reaches the address, only for a loopback bind")
	fs.StringVar(&o.metrics.CertDir, "metrics-cert-dir", "", "directory holding the metrics endpoint's tls.crt and tls.key, reloaded when they change; empty uses a self-signed certificate made at start")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8082", "health probe address")
	v.healthChecks = fs.Bool("health-checks", true, "watch NVML events and report a GPU with a critical Xid unhealthy (its devices are then not advertised)")
	fs.Func("health-ignored-xids", fmt.Sprintf("comma-separated Xids caused by applications, which leave a GPU healthy (default %s)", health.FormatXids(health.DefaultIgnoredXids)), func(s string) error {
		xids, err := health.ParseXids(s)
		o.health.IgnoredXids = xids
		return err
	})
	fs.StringVar(&v.sim.stateFile, "simulate-gpus-state", "", "with --simulate-gpus: a file the simulated GPUs' MIG mode, instances and compute mode are kept in, so a restarted agent finds them as the one before it left them (as real GPUs outlive the agent); mutations are journaled in FILE.journal")
	fs.IntVar(&v.sim.pauseAfter, "simulate-gpus-pause-after", 0, "with --simulate-gpus-state: stop for good after this process's n-th GPU mutation, once it is written, and create FILE.paused (tests kill the agent there)")
	fs.Var(&v.sim, "simulate-gpus", "MODEL:COUNT[:SEQ] (H100 or A100, 1-8 GPUs): run over a simulated DGX with stand-in driver tools instead of NVML, for tests on machines without a GPU (the real-node e2e); never on a real node")
}

// bindShareFlags binds how the node's GPUs are offered: DRA, the device plugin, their resource names,
// the drain and the memory a sized claim is charged beyond its allocations.
func bindShareFlags(fs *flag.FlagSet, o *options, v *flagValues) {
	fs.BoolVar(&v.draOn, "dra", false, "serve this node's GPUs through Dynamic Resource Allocation: publish ResourceSlices (driver gpu.gpusharing.io) and serve the DRA kubelet plugin that prepares claims through CDI (docs/dra.md); with --device-plugin both run side by side")
	fs.BoolVar(&o.resourceSlices, "dra-resource-slices", false, "publish the ResourceSlices without serving the DRA kubelet plugin (--dra does both)")
	fs.StringVar(&v.draCfg.PluginDir, "dra-plugin-dir", v.draCfg.PluginDir, "the DRA kubelet plugin's directory: its gRPC socket dra.sock, its checkpoint of prepared claims and its ledger of dynamic MIG instances (dynmig.json)")
	fs.StringVar(&v.draCfg.RegistryDir, "dra-registry-dir", v.draCfg.RegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&v.draCfg.CDIDir, "cdi-dir", v.draCfg.CDIDir, "where the DRA kubelet plugin writes the CDI specs of prepared claims; the container runtime must read CDI specs there")
	fs.BoolVar(&v.dpOn, "device-plugin", true, "serve the kubelet device plugin API for this node's GPUs (and drain a GPU before a disruptive change)")
	fs.StringVar(&v.dp.SocketDir, "device-plugin-dir", v.dp.SocketDir, "the kubelet's device plugin directory (kubelet.sock and the plugins' sockets)")
	fs.StringVar(&o.podResourcesSocket, "pod-resources-socket", vacate.DefaultPodResourcesSocket, "the kubelet's PodResources API socket, to find the device plugin's pods on a GPU before a disruptive change; empty turns the drain off unless DRA is on (then it waits for the pods holding claims); required where the device plugin serves beside the DRA kubelet plugin, which it tells which GPUs device plugin pods hold")
	fs.DurationVar(&o.drainPoll, "drain-poll-interval", vacate.DefaultPollInterval, "how often a drain lists the kubelet's PodResources again (it has no watch): bounds how long a GPU stays cordoned after its last pod ends")
	fs.DurationVar(&o.drainBackoff, "drain-backoff", node.DefaultDrainBackoff, "first wait before a GPU whose drain timed out or failed is drained again for the same desired sharing (doubles per failure, up to 1h)")
	resourceFlag(fs, &v.dp.Resources.Exclusive, "resource-exclusive", "resource name of a whole GPU")
	resourceFlag(fs, &v.dp.Resources.TimeSlicing, "resource-timeslice", "resource name of one replica of a time-sliced GPU")
	resourceFlag(fs, &v.dp.Resources.MPS, "resource-mps", "resource name of one MPS share of a GPU")
	resourceFlag(fs, &v.dp.Resources.Shared, "resource-shared", "resource name of one share of a GPU scheduled by the shim")
	fs.StringVar(&v.dp.Resources.MIGPrefix, "resource-mig-prefix", v.dp.Resources.MIGPrefix, "prefix of MIG resource names; the profile follows (nvidia.com/mig-1g.10gb)")
	v.ctxReserve = memoryFlag(fs, "context-reserve", dra.DefaultContextReserve, "device memory charged to each CUDA process of a sized claim for its context, which NVML counts and allocation limits do not: an MPS client's pinned limit is its claim less this, and the shim keeps a claim's allocations within the claim less this per process")
	v.mpsServer = memoryFlag(fs, "mps-server-memory", node.DefaultMPSServerMemory, "device memory an MPS server holds itself, left out of what an MPS GPU sized per claim offers claims")
}

// bindShimFlags binds the shim's schedulers: their sockets, oversubscription reserve and guards.
func bindShimFlags(fs *flag.FlagSet, o *options, v *flagValues) {
	fs.StringVar(&o.schedulerRoot, "scheduler-root", "", "directory holding each shim-shared GPU's scheduler socket, <root>/<uuid>/gpushare.sock, which the device plugin mounts into shim-shared pods (default <host-root>/scheduler)")
	fs.DurationVar(&o.shimGuards.FrameTimeout, "shim-frame-timeout", scheduler.DefaultFrameTimeout, "longest a shim client may take to finish a message it started before it is dropped (an idle client, no message started, is never dropped)")
	fs.IntVar(&o.shimGuards.MaxConns, "shim-max-conns", scheduler.DefaultMaxConns, "most connections one GPU's scheduler socket accepts at once; more are closed before any WELCOME and counted in gpusharing_scheduler_connections_refused_total")
	fs.IntVar(&o.shimGuards.MaxConnsPerPeer, "shim-max-conns-per-pod", scheduler.DefaultMaxConnsPerPeer, "most connections one pod (one process where the pod is unknown) may hold on one GPU's scheduler socket; more are closed before any WELCOME and counted in gpusharing_scheduler_connections_refused_total")
	fs.DurationVar(&o.shimGuards.EvictTimeout, "shim-evict-timeout", scheduler.DefaultEvictTimeout, "longest a shim client may take to answer an eviction before it is dropped to pass-through and its memory leaves the budget (counted in gpusharing_scheduler_clients_dropped_total{reason=\"evict-timeout\"})")
	fs.StringVar(&v.dp.ShimLibrary, "shim-library", v.dp.ShimLibrary, "host path of libgpushare.so, mounted into shim-shared containers")
	v.reserve = quantityFlag(fs, "oversub-reserve", resource.NewQuantity(node.DefaultOversubReserve, resource.BinarySI), false, "GPU memory left out of an oversubscription budget the policy does not set, where NVML cannot list the GPU's processes and their memory (elsewhere the budget follows what NVML sees used outside it): CUDA contexts and memory the shim cannot swap live outside the budget")
	// One figure for what a CUDA context holds beyond allocations: unset, the residency check leaves
	// out the same context reserve the claims are charged (--context-reserve).
	v.shimOverhead = quantityFlag(fs, "shim-context-overhead", nil, false, "device memory of a shim process NVML reports beyond its allocations (CUDA context, driver); left out when its reported residency is checked against NVML (default: --context-reserve)")
	v.shimReplicas = fs.Int("shim-replicas", int(v.dp.ShimReplicas), "shares an Exclusive GPU with oversubscription is cut into")
}

// apply turns the parsed flag values into options.
func (v *flagValues) apply(o *options) {
	o.health.Disabled = !*v.healthChecks
	if v.sim.configured {
		o.simulate = &v.sim
	}
	if v.draOn {
		o.resourceSlices = true
		o.draPlugin = &v.draCfg
	}
	if o.schedulerRoot == "" {
		o.schedulerRoot = filepath.Join(o.hostRoot, "scheduler")
	}
	o.oversubReserve = uint64((*v.reserve).Value())
	o.contextReserve = (*v.ctxReserve).Value()
	// One reserve for both halves of a claim's accounting: the kubelet plugin's MPS limits and the
	// schedulers' ledgers.
	o.shimGuards.ContextReserve = uint64(o.contextReserve)
	o.mpsServerMemory = uint64((*v.mpsServer).Value())
	o.mpsShmSize = (*v.shmSize).Value()
	// The device plugin names the sockets the agent's schedulers listen on: one root for both.
	v.dp.SchedulerRoot = o.schedulerRoot
	v.dp.ShimReplicas = int32(*v.shimReplicas)
	// The MPS root is not a device plugin flag: app.Setup takes it from --mps-root, the daemons' root.
	v.dp.MPSRoot = ""
	if v.nodesOn {
		v.dp.Nodes = v.nodes
		// The device plugin's CDI spec goes where the runtime reads the DRA plugin's.
		v.dp.CDIDir = v.draCfg.CDIDir
	}
	// DRA cuts and mounts shares as the device plugin does, whether or not the device plugin runs.
	o.shares = v.dp
	o.shimGuards.ContextOverhead = uint64(o.contextReserve)
	if *v.shimOverhead != nil {
		o.shimGuards.ContextOverhead = uint64((*v.shimOverhead).Value())
	}
	if v.dpOn {
		o.devicePlugin = &v.dp
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
}

// memoryFlag binds a non-negative memory quantity flag with its default; the result is read after Parse.
func memoryFlag(fs *flag.FlagSet, name string, def int64, usage string) **resource.Quantity {
	return quantityFlag(fs, name, resource.NewQuantity(def, resource.BinarySI), false, usage)
}

// quantityFlag binds a quantity flag that must be non-negative (positive: above zero); def nil leaves
// the result nil until the flag is given. The usage names def, or says "(default ...)" itself.
func quantityFlag(fs *flag.FlagSet, name string, def *resource.Quantity, positive bool, usage string) **resource.Quantity {
	q := def
	if def != nil {
		usage = fmt.Sprintf("%s (default %s)", usage, def)
	}
	want, example := "non-negative", "2Gi"
	if positive {
		want = "positive"
	}
	fs.Func(name, usage, func(s string) error {
		v, err := resource.ParseQuantity(s)
		if err != nil || v.Sign() < 0 || (positive && v.Sign() == 0) {
			return fmt.Errorf("want a %s quantity such as %s", want, example)
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
