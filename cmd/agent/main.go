// Command agent is gpusharing's node agent. Run without a subcommand it converges this node's GPUs to
// its GPUNode and publishes their status; `agent inventory` prints what NVML reports and `agent plan`
// plans MIG layouts against the real GPU's profiles, both read-only; `agent install-shim` installs the shim
// library on the host without disturbing processes that loaded an earlier one.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/gpusharing/gpusharing/agent/app"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/metricsauth"
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
	claimStatusInterval time.Duration
	metrics             metricsauth.Options
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
		if n, ok := nvmlGPUs.(*gpu.NVML); ok && len(n.MissingFunctions()) > 0 {
			log.Info("The driver's NVML library lacks functions the agent uses; what needs them is reported as unsupported",
				"functions", n.MissingFunctions())
		}
	}
	if _, isNull := gpus.(gpu.Null); isNull {
		log.Info("NVML is not available; publishing Ready=False NVMLUnavailable", "cause", gpus.(gpu.Null).Cause.Error())
	}

	// The agent starts each MPS daemon through its own mps-launch subcommand.
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the agent's executable for mps-launch: %w", err)
	}
	metricsOpts, err := metricsauth.ServerOptions(o.metrics)
	if err != nil {
		return fmt.Errorf("--metrics-cert-dir: %w", err)
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme(),
		Metrics:                metricsOpts,
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
		// 0 on the command line writes no claim's device status; app.Options reads negative as that.
		ClaimStatusInterval: claimStatusInterval(o.claimStatusInterval),
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

// claimStatusInterval is --claim-status-interval as app.Options reads it: 0 is off.
func claimStatusInterval(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// accountingOptions is nil, no accounting, for --accounting-interval=0.
func accountingOptions(o app.AccountingOptions) *app.AccountingOptions {
	if o.Interval <= 0 {
		return nil
	}
	return &o
}
