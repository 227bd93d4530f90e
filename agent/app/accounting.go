package app

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// AccountingOptions configure the per-pod accounting.
type AccountingOptions struct {
	// Interval is how often the GPUs' processes are read (accounting.DefaultInterval).
	Interval time.Duration
	// MaxSeriesPerGPU bounds the containers a GPU exports per-pod series for
	// (accounting.DefaultMaxSeriesPerGPU).
	MaxSeriesPerGPU int
	// UnmanagedGrace is how long a pod's process may hold a context on a checked GPU without being
	// managed before it is named (guard.DefaultUnmanagedGrace).
	UnmanagedGrace time.Duration
}

// setupAccounting runs the accountant, exports its series and hands its snapshots to the reconciler,
// which publishes each GPU's consumers. Pods are named where the agent sees the host's /proc (ProcRoot):
// the demo's simulated nodes have no pods, and their processes stay unnamed.
func setupAccounting(mgr ctrl.Manager, o Options, r *node.Reconciler, shim *node.ShimSchedulers, pods *podpid.Resolver) error {
	if o.Accounting == nil {
		return nil
	}
	src, ok := o.GPU.(gpu.UsageReader)
	if !ok {
		return nil
	}
	a := &accounting.Accountant{GPUs: src, Interval: o.Accounting.Interval, Clock: o.Clock}
	if pods == nil && o.ProcRoot != "" {
		pods = &podpid.Resolver{Reader: mgr.GetAPIReader(), NodeName: o.NodeName, ProcRoot: o.ProcRoot, Clock: o.Clock}
	}
	if pods != nil {
		a.Pods = pods
	}
	if shim != nil {
		a.Shim = shim
	}
	um, err := guard.NewMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("registering the unmanaged check's metrics: %w", err)
	}
	tracker := &guard.Unmanaged{Grace: o.Accounting.UnmanagedGrace}
	r.Unmanaged = &node.UnmanagedCheck{Tracker: tracker, Metrics: um,
		Enforcer: &guard.Enforcer{NodeName: o.NodeName, Recorder: r.Recorder, Evictor: r.ClaimEvictor, Clock: o.Clock}}
	// A pod over its sized claims, and a process on a checked GPU past its grace, must be seen within
	// seconds (claimguard.go, agent/guard).
	claims := r.Claims
	a.Hurry = func() bool { return tracker.Checking() || claims != nil && len(claims.SizedClaims()) > 0 }
	a.HurryInterval = guard.CheckInterval
	m, err := accounting.NewMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("registering the accounting's metrics: %w", err)
	}
	if o.Accounting.MaxSeriesPerGPU > 0 {
		m.MaxSeriesPerGPU = o.Accounting.MaxSeriesPerGPU
	}
	m.Add(o.NodeName, a)
	r.Usage = a
	// A sample that changes what the status shows (a pod came or left, memory moved past the
	// threshold) wakes a pass; others cost nothing.
	a.OnSample = r.UsageSampled
	deviceStatus, err := setupDeviceStatus(mgr, o, r)
	if err != nil {
		return err
	}
	if deviceStatus != nil {
		a.OnSample = func(s accounting.Snapshot) { r.UsageSampled(s); deviceStatus(s) }
	}
	log := mgr.GetLogger().WithName("accounting")
	return mgr.Add(runnable(func(ctx context.Context) error { return a.Run(ctrl.LoggerInto(ctx, log)) }))
}
