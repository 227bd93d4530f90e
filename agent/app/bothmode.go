package app

import (
	"errors"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpusharing/gpusharing/agent/owner"
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
