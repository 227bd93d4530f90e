// Package setup wires every controller of the manager in one place, so cmd/manager, the envtest suites
// and the benchmark run exactly the same controllers.
package setup

import (
	"context"
	"fmt"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	"github.com/gpusharing/gpusharing/controllers/gate"
	"github.com/gpusharing/gpusharing/controllers/gpunode"
	"github.com/gpusharing/gpusharing/controllers/index"
	"github.com/gpusharing/gpusharing/controllers/policy"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
)

// Leader election's Lease and its events live in the manager's own namespace: config/rbac grants them
// there with a Role, so the ClusterRole generated from these packages holds no cluster-wide leases.

// Options tune the controllers.
type Options struct {
	// ResolverWorkers is how many nodes are resolved at once (admission decisions are serialized, the
	// writes they lead to are not).
	ResolverWorkers int
	// StatusWorkers is how many policies' status are computed at once.
	StatusWorkers int
	// StatusDebounce folds node events into one status pass per policy per interval.
	StatusDebounce time.Duration
	// StatusProgressInterval spaces the policy status writes that only report progress (counts); the
	// transitions are written at once. Zero writes every change.
	StatusProgressInterval time.Duration
	// RestoreTimeout bounds the wait for agents after a policy is deleted; zero means the default.
	RestoreTimeout time.Duration
	// Clock is the controllers' time source (the policy reconciler's deletion bound, the rollout's
	// admission reservations); nil means the real clock.
	Clock clock.PassiveClock
	// WriteLatencyTarget, when set, gates the resolver: it runs at most as many reconciles at once as keep
	// its writes answered within this latency (between GateMin and ResolverWorkers; see package gate).
	// Zero runs ResolverWorkers at once whatever the API server's latency.
	WriteLatencyTarget time.Duration
	// GateMin is the fewest resolver reconciles the gate admits at once; below 1 means 1.
	GateMin int
	// Rightsizing, when set, runs the right-sizing recommender with these options.
	Rightsizing *rightsizing.Options
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool
}

// EventSource is the name events carry as their reporting controller.
const EventSource = "gpusharing-controller"

// Controllers registers the field indexes and every controller with mgr.
func Controllers(ctx context.Context, mgr ctrl.Manager, o Options) error {
	if err := index.Setup(ctx, mgr); err != nil {
		return err
	}
	copts := func(workers int) controller.Options {
		if workers < 1 {
			workers = 1
		}
		return controller.Options{MaxConcurrentReconciles: workers, SkipNameValidation: &o.SkipNameValidation}
	}
	resolver := &gpunode.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Clock: o.Clock}
	ropts := copts(o.ResolverWorkers)
	if o.WriteLatencyTarget > 0 {
		if o.GateMin < 1 {
			o.GateMin = 1
		}
		g := gate.New(gate.Options{Min: o.GateMin, Max: ropts.MaxConcurrentReconciles, Target: o.WriteLatencyTarget, Clock: o.Clock})
		resolver.Client = gate.WithWriteTiming(resolver.Client, g)
		ropts.NewQueue = gate.NewQueue(g)
	}
	if err := resolver.SetupWithManager(mgr, ropts); err != nil {
		return fmt.Errorf("setting up %s: %w", gpunode.ControllerName, err)
	}
	status := &policy.Reconciler{
		Client:           mgr.GetClient(),
		Recorder:         mgr.GetEventRecorder(EventSource),
		RestoreTimeout:   o.RestoreTimeout,
		Clock:            o.Clock,
		ProgressInterval: o.StatusProgressInterval,
	}
	if err := status.SetupWithManager(mgr, copts(o.StatusWorkers), o.StatusDebounce); err != nil {
		return fmt.Errorf("setting up %s: %w", policy.ControllerName, err)
	}
	if o.Rightsizing != nil {
		rs := &rightsizing.Rightsizer{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Options: *o.Rightsizing}
		if o.Rightsizing.Clock == nil {
			rs.Clock = o.Clock
		}
		if err := rs.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the right-sizing: %w", err)
		}
	}
	return nil
}
