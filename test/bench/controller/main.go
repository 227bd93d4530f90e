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
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

type options struct {
	nodes, gpus     int
	change          string
	maxUnavailable  string
	agentWorkers    int
	resolverWorkers int
	qps             float64
	burst           int
	timeout         time.Duration
	managerLog      string
	managerV        int
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 1000, "Nodes (and GPUNodes) to create.")
	flag.IntVar(&o.gpus, "gpus", 8, "GPUs per node.")
	flag.StringVar(&o.change, "change", "both", "Policy change to time after creation: tweak (MPS percentage, goes out at once), strategy (MPS to time-slicing, disruptive, rolled out within maxUnavailable) or both.")
	flag.StringVar(&o.maxUnavailable, "max-unavailable", "100%", "The policy's rollout.maxUnavailable (a count or a percentage).")
	flag.IntVar(&o.agentWorkers, "agent-workers", 8, "Goroutines playing the agents.")
	flag.IntVar(&o.resolverWorkers, "resolver-workers", 8, "The manager's --resolver-workers.")
	flag.Float64Var(&o.qps, "qps", 200, "The manager's --kube-api-qps.")
	flag.IntVar(&o.burst, "burst", 400, "The manager's --kube-api-burst.")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "Give up on a step after this long.")
	flag.StringVar(&o.managerLog, "manager-log", "", "Keep the manager's log in this file (default: discarded with its temporary directory).")
	flag.IntVar(&o.managerV, "manager-v", 0, "The manager's log verbosity (-v).")
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
	var mgr *manager
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		if mgr != nil {
			mgr.stop()
		}
		_ = env.Stop()
		os.Exit(130)
	}()

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

	mgr, err = startManager(ctx, env, o)
	if err != nil {
		return err
	}
	defer mgr.stop()
	fmt.Printf("Manager running as pid %d (%s), idle RSS %s\n", mgr.pid(), mgr.binary, mib(mgr.rss()))

	steps := []step{{name: "create policy (as found -> MPS 4x25%, disruptive)", sharing: b.MPS(4, 25), create: true}}
	switch o.change {
	case "tweak":
		steps = append(steps, step{name: "change MPS 25% -> 50% (non-disruptive)", sharing: b.MPS(4, 50)})
	case "strategy":
		steps = append(steps, step{name: "change MPS -> TimeSlicing (disruptive)", sharing: b.TimeSlicing(4, v1.TimeSliceShort)})
	default:
		steps = append(steps,
			step{name: "change MPS 25% -> 50% (non-disruptive)", sharing: b.MPS(4, 50)},
			step{name: "change MPS -> TimeSlicing (disruptive)", sharing: b.TimeSlicing(4, v1.TimeSliceShort)})
	}
	fmt.Printf("\nnodes=%d gpus/node=%d maxUnavailable=%s resolver-workers=%d qps=%.0f burst=%d\n",
		o.nodes, o.gpus, o.maxUnavailable, o.resolverWorkers, o.qps, o.burst)
	for _, s := range steps {
		r, err := s.run(ctx, env, agents, mgr, o)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		r.print()
	}
	fmt.Printf("\nManager peak RSS (VmHWM of the child process): %s\n", mib(mgr.peakRSS()))
	return nil
}

func mib(kib int64) string {
	if kib < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f MiB", float64(kib)/1024)
}
