package app

import (
	"context"
	"errors"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpusharing/gpusharing/agent/node"
	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/share"
)

// bothOwners is the one arbiter between the device plugin and the DRA kubelet plugin where the agent
// serves both (agent/owner): each GPU, or MIG instance, is handed out by the one that holds it first. Nil
// where only one of them serves, which then looks nothing up. The device plugin's side is read from the
// kubelet's PodResources, so serving both needs it.
func bothOwners(o Options, podResources podresourcesv1.PodResourcesListerClient) (*owner.Owners, error) {
	if o.DevicePlugin == nil || o.DRAPlugin == nil {
		return nil, nil
	}
	if podResources == nil {
		return nil, errors.New("serving the device plugin beside the DRA kubelet plugin needs the kubelet's PodResources API (--pod-resources-socket): without it a GPU could go to a device plugin pod and a claim at once")
	}
	return owner.New(podResources, o.InFlightGrace, o.Clock), nil
}

// withheld keeps out of the ResourceSlices the shares of a GPU (or MIG instance) the device plugin holds,
// so the kube-scheduler allocates no claim that could only wait for it; nil without an arbiter.
func withheld(owners *owner.Owners) func(share.Device) bool {
	if owners == nil {
		return nil
	}
	return func(d share.Device) bool { return owners.HeldByDevicePlugin(owner.UnitOf(d)) }
}

// watchOwners reads the kubelet's PodResources once now, then as often as the device plugin looks at the
// kubelet and right after each Allocate, and wakes a pass when the GPUs device plugin pods hold change:
// the pass publishes the slices again without them, or with them once they are free.
func watchOwners(mgr ctrl.Manager, o Options, owners *owner.Owners, r *node.Reconciler) error {
	if owners == nil {
		return nil
	}
	// Before anything serves: the first slices of a restarted agent leave out what device plugin pods hold.
	if err := owners.Refresh(context.Background()); err != nil {
		mgr.GetLogger().Error(err, "Cannot read which GPUs device plugin pods hold; reading again every poll")
	}
	interval := o.DevicePlugin.WithDefaults().KubeletPollInterval
	return mgr.Add(runnable(func(ctx context.Context) error {
		owners.Watch(ctx, interval, r.Notify)
		return nil
	}))
}
