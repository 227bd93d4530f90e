// Command manager runs gpusharing's controllers: the resolver, which turns GPUSharingPolicies into each
// GPUNode's spec and rolls disruptive changes out within each policy's budget, and the policy status
// reconciler.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2/textlogger"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/policy"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/internal/metricsauth"
)

// Leader election defaults. The renew deadline is the longest API server outage a leader rides out: past
// it, controller-runtime stops leading and the process exits (a restart loses nothing, every controller
// rebuilds from the API server, but the pod restarts). 60 s covers a 30 s outage (a control-plane upgrade,
// an etcd leader change) plus the time a restarted API server takes to answer again (13 s on the loaded
// test machine, docs/reliability.md). The lease outlasts the deadline by 15 s, so a follower never takes
// over before the old leader has given up. The price is failover time when the leader dies without
// releasing the lease (a SIGKILL, a lost node): up to 75 s plus a retry. A graceful stop (a rolling
// update) releases it at once, and the agents keep serving their nodes without the manager meanwhile.
const (
	defaultLeaseDuration = 75 * time.Second
	defaultRenewDeadline = 60 * time.Second
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

// managerFlags are the manager's flags, parsed once in run.
type managerFlags struct {
	metrics        metricsauth.Options
	probeAddr      string
	leaderElect    bool
	leaderElectNS  string
	qps            float64
	burst          int
	resolvers      int
	statusWorkers  int
	restoreTimeout time.Duration
	debounce       time.Duration
	pprofAddr      string
	latencyTarget  time.Duration
	progressEvery  time.Duration
	gateMin        int
	leaseDuration  time.Duration
	renewDeadline  time.Duration
	retryPeriod    time.Duration
	rightsizing    bool
	rsSample       time.Duration
	rsFlush        time.Duration
	rsCheckpoint   time.Duration
	rsNewClaims    int
	rsMinHistory   time.Duration
	rsMinSamples   int64
}

// flagSet binds every flag of the manager to f: the flag set run parses and docs/reference lists,
// with klog's -v and controller-runtime's --kubeconfig.
// rightsizingOptions are the right-sizing's options from the flags; nil turns it off.
func (f *managerFlags) rightsizingOptions() *rightsizing.Options {
	if !f.rightsizing {
		return nil
	}
	o := rightsizing.DefaultOptions()
	o.SampleInterval, o.FlushInterval, o.CheckpointInterval = f.rsSample, f.rsFlush, f.rsCheckpoint
	o.MaxNewClaimsPerPass = f.rsNewClaims
	o.Config.MinHistory, o.Config.MinMemorySamples = f.rsMinHistory, f.rsMinSamples
	return &o
}

func flagSet(f *managerFlags) (*flag.FlagSet, *textlogger.Config) {
	fs := flag.NewFlagSet("manager", flag.ExitOnError)
	fs.StringVar(&f.metrics.BindAddress, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.BoolVar(&f.metrics.Secure, "metrics-secure", true, "Serve metrics over HTTPS to callers the API server authenticates (TokenReview) and authorizes to get /metrics (SubjectAccessReview; the ClusterRole gpusharing-metrics-reader grants it). false serves plain HTTP to whoever reaches the address: only for a loopback bind.")
	fs.StringVar(&f.metrics.CertDir, "metrics-cert-dir", "", "Directory holding the metrics endpoint's tls.crt and tls.key, reloaded when they change; empty uses a self-signed certificate made at start.")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz probes bind to.")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "Elect a leader so that only one replica reconciles at a time (the Lease gpusharing-controller.gpusharing.io).")
	fs.StringVar(&f.leaderElectNS, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's namespace).")
	fs.Float64Var(&f.qps, "kube-api-qps", 50, "Sustained requests per second to the API server; one spec write per node per change, so this bounds rollout speed.")
	fs.IntVar(&f.burst, "kube-api-burst", 100, "Burst of requests to the API server above kube-api-qps.")
	fs.IntVar(&f.resolvers, "resolver-workers", 1, "The most nodes resolved at once; admission decisions are serialized, the writes run in parallel. With one, the agents' acks keep the API server busy between the resolver's writes and each write is answered 2-3x sooner; a rollout took 1.0-1.25x as long as with 8 at 10,000 nodes (docs/controller.md). Raise it for rollout speed over reconcile latency, or when each write waits on the network.")
	fs.DurationVar(&f.latencyTarget, "write-latency-target", 50*time.Millisecond, "The resolver runs as many reconciles at once (at least --resolver-min-workers, at most --resolver-workers) as keep its writes answered within this latency: more writes in flight than the API server serves only queue there. 0 always runs --resolver-workers.")
	fs.IntVar(&f.gateMin, "resolver-min-workers", 1, "The fewest nodes resolved at once however slow the API server answers.")
	fs.IntVar(&f.statusWorkers, "status-workers", 2, "Policies whose status is computed at once.")
	fs.DurationVar(&f.debounce, "status-debounce", time.Second, "Node events are folded into one policy status pass (and at most one status write) per policy per this interval: during a rollout every pass writes, and at 250ms those writes took a tenth of a saturated API server's throughput.")
	fs.DurationVar(&f.progressEvery, "status-progress-interval", 5*time.Second, "A policy status write that only reports progress (counts) waits until this long after the policy's last status write; condition changes and a new observed generation are written at once. 0 writes every change.")
	fs.DurationVar(&f.restoreTimeout, "restore-timeout", policy.DefaultRestoreTimeout, "How long a deleted policy waits for agents to confirm its GPUs are back on the default.")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "", "Address Go's pprof endpoints bind to (/debug/pprof/); empty disables them.")
	fs.DurationVar(&f.leaseDuration, "leader-election-lease-duration", defaultLeaseDuration, "How long a follower waits after the leader's last renewal before it takes over: the failover time when a leader dies without releasing the lease.")
	fs.DurationVar(&f.renewDeadline, "leader-election-renew-deadline", defaultRenewDeadline, "How long the leader keeps trying to renew before it gives up leading and exits (less than the lease duration): the longest API server outage the manager rides out.")
	fs.DurationVar(&f.retryPeriod, "leader-election-retry-period", 2*time.Second, "How often candidates try to acquire or renew the lease.")
	rs := rightsizing.DefaultOptions()
	fs.BoolVar(&f.rightsizing, "rightsizing", true, "Recommend the size of each workload's sized GPU claims from what its pods hold and use (GPUShareRecommendation, docs/rightsizing.md).")
	fs.DurationVar(&f.rsSample, "rightsizing-sample-interval", rs.SampleInterval, "How often the sized claims in the cached GPUNode status are read for samples.")
	fs.DurationVar(&f.rsFlush, "rightsizing-write-interval", rs.FlushInterval, "How often recommendations that changed for their readers are written.")
	fs.DurationVar(&f.rsCheckpoint, "rightsizing-checkpoint-interval", rs.CheckpointInterval, "The longest a recommendation's history (its histograms) goes unwritten while only it changed.")
	fs.IntVar(&f.rsNewClaims, "rightsizing-max-new-claims-per-pass", rs.MaxNewClaimsPerPass, "The most claims a sample pass reads for the first time (the claim, its pod, a ReplicaSet or Job: up to three requests each); the rest wait for later passes, so a restart at fleet scale spreads its reads. 0: no bound.")
	fs.DurationVar(&f.rsMinHistory, "rightsizing-min-history", rs.Config.MinHistory, "How long samples must have come in before a workload gets a recommendation.")
	fs.Int64Var(&f.rsMinSamples, "rightsizing-min-samples", rs.Config.MinMemorySamples, "The fewest pod peaks (one per pod per day) before a workload gets a recommendation.")
	logCfg := textlogger.NewConfig()
	logCfg.AddFlags(fs)
	config.RegisterFlags(fs)
	return fs, logCfg
}

func run() error {
	var f managerFlags
	fs, logCfg := flagSet(&f)
	_ = fs.Parse(os.Args[1:])
	ctrl.SetLogger(textlogger.NewLogger(logCfg))
	if f.leaderElect && f.leaseDuration <= f.renewDeadline {
		// Lowering only the lease (say to the former 15 s) would leave it under the 60 s default deadline.
		return fmt.Errorf("--leader-election-lease-duration (%s) must be longer than --leader-election-renew-deadline (%s): set both", f.leaseDuration, f.renewDeadline)
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(f.qps), f.burst
	metricsOpts, err := metricsauth.ServerOptions(f.metrics)
	if err != nil {
		return fmt.Errorf("--metrics-cert-dir: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsOpts,
		// managedFields are a large share of every cached GPUNode (the agent's status fields, the
		// resolver's spec fields) and of every Node's metadata, and the controllers never read them
		// (they write merge patches): dropping them from the cache cuts the manager's memory per node.
		Cache:                         cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
		HealthProbeBindAddress:        f.probeAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              "gpusharing-controller.gpusharing.io",
		LeaderElectionNamespace:       f.leaderElectNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &f.leaseDuration,
		RenewDeadline:                 &f.renewDeadline,
		RetryPeriod:                   &f.retryPeriod,
		PprofBindAddress:              f.pprofAddr,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := setup.Controllers(ctx, mgr, setup.Options{
		ResolverWorkers:        f.resolvers,
		StatusWorkers:          f.statusWorkers,
		RestoreTimeout:         f.restoreTimeout,
		StatusDebounce:         f.debounce,
		WriteLatencyTarget:     f.latencyTarget,
		StatusProgressInterval: f.progressEvery,
		GateMin:                f.gateMin,
		Rightsizing:            f.rightsizingOptions(),
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager")
	return mgr.Start(ctx)
}
