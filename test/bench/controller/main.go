// Command controller benchmarks gpusharing's controller at scale against a real kube-apiserver and
// etcd (test/testenv): it creates N Nodes and GPUNodes with 8 GPUs each, runs the real manager binary
// (cmd/manager) as a child process, plays every node's agent (acking each spec at once), creates a
// policy and then changes it, and prints for each step the time until every spec is written, the time
// until the policy is Ready, reconcile latency quantiles from the manager's own histogram, and the
// manager's peak RSS (VmHWM of the child process, so neither the agents nor the API server count).
//
//	go run ./test/bench/controller -nodes 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/gpunode"
	"github.com/gpusharing/gpusharing/controllers/policy"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

type options struct {
	nodes, gpus     int
	change          string
	maxUnavailable  string
	agentWorkers    int
	resolverWorkers int
	// resolverMinWorkers and writeLatencyTarget are the manager's gate (see controllers/gate).
	resolverMinWorkers int
	writeLatencyTarget time.Duration
	qps                float64
	burst              int
	timeout            time.Duration
	managerLog         string
	managerV           int
	pprof              bool
	floor              bool
	failover           bool
	// failoverMaxUnavailable is the rollout budget of the failover step.
	failoverMaxUnavailable string
	// warmup runs the first floor once, untimed, before the timed phases (see warmUp).
	warmup bool
	// floorWatchers is how many passive GPUNode watchers run during each floor (see startWatchers).
	floorWatchers int
	// floorWriters and floorMinWriters bound the floor's writes in flight, apart from the manager's:
	// the floor must be the fastest the API server takes these writes, whatever the manager is set to.
	floorWriters, floorMinWriters int
	// kubeconfig, when set, is where an admin kubeconfig of the bench's API server is written, so the
	// running bench can be inspected (kubectl get --raw /debug/pprof/profile profiles the API server).
	kubeconfig string
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 1000, "Nodes (and GPUNodes) to create.")
	flag.IntVar(&o.gpus, "gpus", 8, "GPUs per node.")
	flag.StringVar(&o.change, "change", "both", "Policy change to time after creation: tweak (MPS percentage, goes out at once), strategy (MPS to time-slicing, disruptive, rolled out within maxUnavailable), both, or none (only the create step).")
	flag.StringVar(&o.maxUnavailable, "max-unavailable", "100%", "The policy's rollout.maxUnavailable (a count or a percentage).")
	flag.IntVar(&o.agentWorkers, "agent-workers", 8, "Goroutines playing the agents.")
	flag.IntVar(&o.resolverWorkers, "resolver-workers", 1, "The manager's --resolver-workers.")
	flag.IntVar(&o.resolverMinWorkers, "resolver-min-workers", 1, "The manager's --resolver-min-workers.")
	flag.DurationVar(&o.writeLatencyTarget, "write-latency-target", 50*time.Millisecond, "The manager's --write-latency-target (0: always --resolver-workers at once).")
	flag.Float64Var(&o.qps, "qps", 200, "The manager's --kube-api-qps.")
	flag.IntVar(&o.burst, "burst", 400, "The manager's --kube-api-burst.")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "Give up on a step after this long.")
	flag.StringVar(&o.managerLog, "manager-log", "", "Keep the manager's log in this file (default: discarded with its temporary directory).")
	flag.IntVar(&o.managerV, "manager-v", 0, "The manager's log verbosity (-v).")
	flag.BoolVar(&o.pprof, "pprof", false, "Serve the manager's /debug/pprof/ (its address is printed) to profile a step.")
	flag.BoolVar(&o.floor, "floor", true, "Measure the floor: the same spec writes and acks by a bare client with no controller.")
	flag.BoolVar(&o.warmup, "warmup", true, "Run the create step's floor once, untimed, before the timed phases: a fresh API server is cheaper a write than a used one.")
	flag.IntVar(&o.floorWatchers, "floor-watchers", 0, "Passive GPUNode watchers (informers that do nothing) to run during each floor: what a watcher such as the manager's costs the API server.")
	flag.IntVar(&o.floorWriters, "floor-writers", 8, "Most writes the floor keeps in flight (its gate, as the manager's, with -write-latency-target). Independent of -resolver-workers: on 2 cores, 2-8 writes in flight are 11-22% faster than one, and the floor is meant to be a lower bound.")
	flag.IntVar(&o.floorMinWriters, "floor-min-writers", 2, "Fewest writes the floor keeps in flight.")
	flag.BoolVar(&o.failover, "failover", true, "Run the leader failover step: two replicas, the leader SIGKILLed mid-rollout.")
	flag.StringVar(&o.failoverMaxUnavailable, "failover-max-unavailable", "10%", "The failover step's rollout.maxUnavailable.")
	flag.StringVar(&o.kubeconfig, "admin-kubeconfig", "", "Write an admin kubeconfig of the bench's API server to this file (to inspect or profile it while the bench runs).")
	flag.Parse()
	ctrl.SetLogger(logr.Discard())
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx := context.Background()
	fmt.Printf("Starting kube-apiserver and etcd (test/testenv)...\n")
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	// An interrupted benchmark must not leave kube-apiserver, etcd and the manager running.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		stopAll()
		_ = env.Stop()
		os.Exit(130)
	}()

	if o.kubeconfig != "" {
		if err := writeKubeconfig(env, o.kubeconfig); err != nil {
			return err
		}
		fmt.Printf("Admin kubeconfig of the API server: %s\n", o.kubeconfig)
	}
	start := time.Now()
	if err := createNodes(ctx, env, o); err != nil {
		return err
	}
	fmt.Printf("Created %d Nodes and GPUNodes with %d GPUs each in %s\n", o.nodes, o.gpus, time.Since(start).Round(time.Millisecond))

	agents, err := startAgents(ctx, env, o)
	if err != nil {
		return err
	}
	defer agents.stop()

	mb, err := buildManager(ctx, env)
	if err != nil {
		return err
	}
	defer mb.remove()
	steps := []step{{name: "create policy (as found -> MPS 4x25%, disruptive)", sharing: b.MPS(4, 25), create: true}}
	switch o.change {
	case "none":
	case "tweak":
		steps = append(steps, step{name: "change MPS 25% -> 50% (non-disruptive)", sharing: b.MPS(4, 50)})
	case "strategy":
		steps = append(steps, step{name: "change MPS -> TimeSlicing (disruptive)", sharing: b.TimeSlicing(4, v1.TimeSliceShort)})
	default:
		steps = append(steps,
			step{name: "change MPS 25% -> 50% (non-disruptive)", sharing: b.MPS(4, 50)},
			step{name: "change MPS -> TimeSlicing (disruptive)", sharing: b.TimeSlicing(4, v1.TimeSliceShort)})
	}
	fmt.Printf("\nnodes=%d gpus/node=%d maxUnavailable=%s resolver-workers=%d (min %d, write latency target %s) qps=%.0f burst=%d\n",
		o.nodes, o.gpus, o.maxUnavailable, o.resolverWorkers, o.resolverMinWorkers, o.writeLatencyTarget, o.qps, o.burst)
	if o.floor {
		g := floorGate(o)
		fmt.Printf("floor: a bare client, %d-%d writes in flight (write latency target %s; 0: no gate), same qps and burst\n", g.Min, g.Max, g.Target)
	}
	fmt.Printf("etcd runs with --unsafe-no-fsync (envtest's default), for the floor and the controller alike\n")
	// Each step's floor and controller run back to back from the same state, alternating which goes
	// first (even steps the floor, odd steps the controller): on a machine whose load changes by the
	// minute, a fixed order would favour whichever runs in the quieter half. The floor writes exactly the
	// spec the controller writes (same policy generation), so a floor that runs second leaves the state
	// the controller's step left, and either order needs one untimed restore per step.
	if o.warmup && o.floor {
		if err := warmUp(ctx, env, agents, o, steps[0]); err != nil {
			return err
		}
	}
	results := make([]result, 0, len(steps))
	floors := make([]floorResult, len(steps))
	var peak int64 = -1
	for i, s := range steps {
		gen := int64(i + 1) // the policy's generation once the step's write lands: created at 1, +1 per change
		floorFirst := i%2 == 0
		snap := agents.snapshot()
		floor := func() error {
			if !o.floor {
				return nil
			}
			d, err := runFloor(ctx, env, agents, o, s.sharing, gen)
			if err != nil {
				return err
			}
			floors[i] = d
			fmt.Printf("\nfloor for %q (%s): %.2fs, bare spec patch p50 %.1fms p99 %.1fms; %s\n",
				s.name, map[bool]string{true: "before the controller", false: "after the controller"}[floorFirst],
				d.took.Seconds(), ms(d.patchP50), ms(d.patchP99), d.writes)
			return nil
		}
		if floorFirst {
			if err := floor(); err != nil {
				return err
			}
			if err := restoreTimed(ctx, env, agents, snap, o); err != nil {
				return err
			}
		}
		r, rss, err := runController(ctx, env, agents, mb, o, s, i, gen)
		peak = max(peak, rss)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		r.print()
		results = append(results, r)
		if !floorFirst && o.floor {
			if err := restoreTimed(ctx, env, agents, snap, o); err != nil {
				return err
			}
			if err := floor(); err != nil {
				return err
			}
		}
	}
	fmt.Printf("\nManager peak RSS (largest VmHWM of the step's manager processes): %s\n", mib(peak))

	var fo *failoverResult
	if o.failover {
		r, err := runFailover(ctx, env, agents, mb, o)
		if err != nil {
			return fmt.Errorf("failover: %w", err)
		}
		r.print(o)
		fo = &r
	}
	summarize(o, steps, results, floors, peak, fo)
	return nil
}

// summarize prints the figures issue 16 asks for in one block: floor, ratios, peak RSS, reconcile p99,
// the failover line and the command that reproduces them.
func summarize(o options, steps []step, results []result, floors []floorResult, peak int64, fo *failoverResult) {
	fmt.Printf("\n== summary: %d nodes x %d GPUs ==\n", o.nodes, o.gpus)
	fmt.Printf("%-52s %9s %9s %7s %12s %12s %12s\n", "step", "floor", "Ready", "ratio", "resolver p99", "status p99", "bare patch p99")
	for i, r := range results {
		ratio := "-"
		if floors[i].took > 0 {
			ratio = fmt.Sprintf("%.2fx", r.ready.Seconds()/floors[i].took.Seconds())
		}
		fmt.Printf("%-52s %8.2fs %8.2fs %7s %10.1fms %10.1fms %12.1fms\n", steps[i].name, floors[i].took.Seconds(), r.ready.Seconds(), ratio,
			r.resolver.p99*1000, r.status.p99*1000, ms(floors[i].patchP99))
	}
	fmt.Printf("manager peak RSS %s (reconcile p99 from controller_runtime_reconcile_time_seconds of %s and %s)\n",
		mib(peak), gpunode.ControllerName, policy.ControllerName)
	if fo != nil {
		verdict := "PASS"
		if !fo.ok() {
			verdict = "FAIL"
		}
		fmt.Printf("failover: takeover %.1fs after SIGKILL, Ready %.1fs, max disrupted %d/%d, GPUs configured twice %d: %s\n",
			fo.takeover.Seconds(), fo.ready.Seconds(), fo.maxDisrupted, fo.limit, fo.twice, verdict)
	}
	fmt.Printf("reproduce: make bench-controller BIN=<bin> BENCH_ARGS=%q\n", strings.Join(os.Args[1:], " "))
}

// runController starts a fresh manager for step i, waits until it has resolved every node and settled,
// runs the step and stops the manager; it returns the step's result and the manager's peak RSS.
func runController(ctx context.Context, env *testenv.Env, a *agents, mb *managerBuild, o options, s step, i int, gen int64) (result, int64, error) {
	before, err := scrapeWrites(ctx, env)
	if err != nil {
		return result{}, -1, err
	}
	mgr, err := mb.start(o, fmt.Sprintf("manager-%d", i))
	if err != nil {
		return result{}, -1, err
	}
	defer mgr.stop()
	if err := mgr.waitIdle(o.nodes, o.timeout); err != nil {
		return result{}, mgr.peakRSS(), err
	}
	settled, err := scrapeWrites(ctx, env)
	if err != nil {
		return result{}, mgr.peakRSS(), err
	}
	fmt.Printf("\nManager %d running as pid %d, idle RSS %s; its start-up (initial list and resolve of every node): %s\n",
		i, mgr.pid(), mib(mgr.rss()), settled.since(before))
	if mgr.pprof != "" {
		fmt.Printf("Manager pprof: http://%s/debug/pprof/\n", mgr.pprof)
	}
	r, err := s.run(ctx, env, a, mgr, o)
	if err == nil && r.gen != gen {
		err = fmt.Errorf("the policy reached generation %d, the floor assumed %d", r.gen, gen)
	}
	if err == nil {
		var after writeCounts
		if after, err = scrapeWrites(ctx, env); err == nil {
			r.writes = after.since(settled) + "; " + objectSize(ctx, env)
		}
	}
	return r, mgr.peakRSS(), err
}

// warmUp runs the first step's floor once, untimed, and puts every GPUNode back. A fresh API server and
// etcd served the first phase of a run for less CPU a write than any later phase (11.8 ms against
// 14.8-18.2 at 10,000 nodes), and the first phase is the create step's floor: without a warm-up the
// create ratio compared a fresh server with a used one.
func warmUp(ctx context.Context, env *testenv.Env, a *agents, o options, first step) error {
	snap := a.snapshot()
	d, err := runFloor(ctx, env, a, o, first.sharing, 1)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	fmt.Printf("\nwarm-up (untimed; the create step's floor once on the fresh API server): %.2fs; %s\n", d.took.Seconds(), d.writes)
	return restoreTimed(ctx, env, a, snap, o)
}

// restoreTimed is restore with its time printed (it is not part of any ratio).
func restoreTimed(ctx context.Context, env *testenv.Env, a *agents, snap map[string]*v1.GPUNode, o options) error {
	start := time.Now()
	if err := restore(ctx, env, a, snap, o.timeout); err != nil {
		return err
	}
	fmt.Printf("(restored every GPUNode to the step's starting state in %.1fs, untimed)\n", time.Since(start).Seconds())
	return nil
}

// writeKubeconfig copies an admin kubeconfig of env's API server to path.
func writeKubeconfig(env *testenv.Env, path string) error {
	dir, err := os.MkdirTemp("", "bench-kubeconfig-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kc, err := env.AdminKubeconfig(dir)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(kc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(kib int64) string {
	if kib < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f MiB", float64(kib)/1024)
}
