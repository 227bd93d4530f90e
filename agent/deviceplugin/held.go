package deviceplugin

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpusharing/gpusharing/agent/share"
)

// PodResourcesLister is the part of the kubelet's PodResources v1 API that tells which devices pods
// hold; the generated client satisfies it.
type PodResourcesLister interface {
	List(ctx context.Context, in *podresourcesv1.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error)
}

// heldListTimeout bounds one List call made for a cordoned GPU: the call is made on every kubelet poll
// while a GPU is cordoned, and a kubelet that does not answer must not hold up the plugin.
const heldListTimeout = 2 * time.Second

// heldDevice is a device the kubelet has allocated to a running pod.
type heldDevice struct {
	res share.ResourceName
	id  string
}

// listHeld asks the kubelet which devices its pods hold. A nil lister holds nothing.
func listHeld(ctx context.Context, l PodResourcesLister) (map[heldDevice]bool, error) {
	if l == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, heldListTimeout)
	defer cancel()
	resp, err := l.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing the kubelet's pod resources: %w", err)
	}
	held := map[heldDevice]bool{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					held[heldDevice{share.ResourceName(d.GetResourceName()), id}] = true
				}
			}
		}
	}
	return held, nil
}
