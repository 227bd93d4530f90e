package app

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/node"
)

// setupDeviceStatus runs the writer of the prepared sized claims' device status (agent/dra
// devicestatus.go) where the kubelet plugin and the accounting run, and returns what the accountant
// tells each snapshot; nil where none runs.
func setupDeviceStatus(mgr ctrl.Manager, o Options, r *node.Reconciler) (func(accounting.Snapshot), error) {
	plugin, ok := r.Claims.(*dra.KubeletPlugin)
	if !ok || o.ClaimStatusInterval < 0 {
		return nil, nil
	}
	kube, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("building the device status client: %w", err)
	}
	w := &dra.DeviceStatusWriter{Plugin: plugin, Kube: kube, Interval: o.ClaimStatusInterval, Clock: o.Clock,
		Log: mgr.GetLogger().WithName("device-status")}
	if err := mgr.Add(runnable(func(ctx context.Context) error { return w.Run(ctx) })); err != nil {
		return nil, err
	}
	return w.Sampled, nil
}
