package dra

import (
	"context"
	"fmt"
	"slices"
	"sort"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/vacate"
)

// claimPageSize bounds one List of ResourceClaims: a cluster may hold many, and the agent reads them
// uncached.
const claimPageSize = 500

// ClaimHolders finds, for vacating a GPU, the pods holding ResourceClaims allocated devices of one GPU of
// this node: a claim's status.allocation names this driver, this node's pool and a device of the GPU,
// and its status.reservedFor names the pods using it (vacate.ClaimHolders).
type ClaimHolders struct {
	// Reader lists ResourceClaims; pass an uncached reader (manager.GetAPIReader()).
	Reader client.Reader
	// Node is this node, the pool the agent publishes.
	Node string
}

// PodsHoldingGPU lists the pods, sorted, that a claim on the GPU of index (or one of its MIG instances)
// is reserved for; with a scope, only the claims it names count. A claim allocated but reserved for no
// pod holds nothing to wait for.
func (h ClaimHolders) PodsHoldingGPU(ctx context.Context, index int32, scope *vacate.ClaimScope) ([]vacate.PodRef, error) {
	seen := map[vacate.PodRef]bool{}
	var out []vacate.PodRef
	cont := ""
	for {
		var list resourcev1.ResourceClaimList
		if err := h.Reader.List(ctx, &list, client.Limit(claimPageSize), client.Continue(cont)); err != nil {
			return nil, fmt.Errorf("listing ResourceClaims: %w", err)
		}
		for i := range list.Items {
			c := &list.Items[i]
			if !h.onGPU(c, index) || (scope != nil && !inScope(scope, c, h.Node)) {
				continue
			}
			for _, r := range c.Status.ReservedFor {
				if r.APIGroup != "" || r.Resource != "pods" {
					continue
				}
				ref := vacate.PodRef{Namespace: c.Namespace, Name: r.Name}
				if !seen[ref] {
					seen[ref] = true
					out = append(out, ref)
				}
			}
		}
		if cont = list.Continue; cont == "" {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// inScope says whether the scope names claim c, by uid or by a device of its allocation on node.
func inScope(s *vacate.ClaimScope, c *resourcev1.ResourceClaim, node string) bool {
	if slices.Contains(s.Claims, c.UID) {
		return true
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.Pool == node && slices.Contains(s.Devices, r.Device) {
			return true
		}
	}
	return false
}

func (h ClaimHolders) onGPU(c *resourcev1.ResourceClaim, index int32) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.Pool == h.Node && OfGPU(r.Device, index) {
			return true
		}
	}
	return false
}
