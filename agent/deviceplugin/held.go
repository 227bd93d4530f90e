package deviceplugin

import (
	"context"
	"time"

	"github.com/gpusharing/gpusharing/agent/podres"
	"github.com/gpusharing/gpusharing/agent/share"
)

// PodResourcesLister is the part of the kubelet's PodResources v1 API that tells which devices pods
// hold; the generated client satisfies it.
type PodResourcesLister = podres.Lister

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
	resp, err := podres.List(ctx, l, heldListTimeout)
	if err != nil {
		return nil, err
	}
	held := map[heldDevice]bool{}
	for d := range podres.Devices(resp) {
		held[heldDevice{share.ResourceName(d.Resource), d.ID}] = true
	}
	return held, nil
}
