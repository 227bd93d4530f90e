package dra

import (
	"context"
	"fmt"
	"sort"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/drain"
)

// claimPageSize bounds one List of ResourceClaims: a cluster may hold many, and the agent reads them
// uncached.
const claimPageSize = 500

// ClaimHolders finds, for the drain, the pods holding ResourceClaims allocated devices of one GPU of
// this node: a claim's status.allocation names this driver, this node's pool and a device of the GPU,
// and its status.reservedFor names the pods using it (drain.ClaimHolders).
type ClaimHolders struct {
	// Reader lists ResourceClaims; pass an uncached reader (manager.GetAPIReader()).
	Reader client.Reader
	// Node is this node, the pool the agent publishes.
	Node string
}

// PodsHoldingGPU lists the pods, sorted, that a claim on the GPU of index (or one of its MIG instances)
// is reserved for. A claim allocated but reserved for no pod holds nothing to wait for.
func (h ClaimHolders) PodsHoldingGPU(ctx context.Context, index int32) ([]drain.PodRef, error) {
	seen := map[drain.PodRef]bool{}
	var out []drain.PodRef
	scope, scoped := ctx.Value(drainScopeKey{}).(DrainScope)
	cont := ""
	for {
		var list resourcev1.ResourceClaimList
		if err := h.Reader.List(ctx, &list, client.Limit(claimPageSize), client.Continue(cont)); err != nil {
			return nil, fmt.Errorf("listing ResourceClaims: %w", err)
		}
		for i := range list.Items {
			c := &list.Items[i]
			if !h.onGPU(c, index) || (scoped && !scope.holds(c, h.Node)) {
				continue
			}
			for _, r := range c.Status.ReservedFor {
				if r.APIGroup != "" || r.Resource != "pods" {
					continue
				}
				ref := drain.PodRef{Namespace: c.Namespace, Name: r.Name}
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

// DrainScope narrows a drain to the claims a change takes from a GPU: a fixed-layout change of a
// dynamic MIG GPU takes the claims whose instances its new fixed instances need (Claims) and the claims
// holding the fixed instances it destroys (Devices, published device names), and no other claim's pod.
type DrainScope struct {
	Claims  []types.UID
	Devices []string
}

type drainScopeKey struct{}

// WithDrainScope gives the drain running under ctx a scope: PodsHoldingGPU then lists only the pods of
// the claims in it. The drain passes its context to every listing, so the scope holds for the whole run.
func WithDrainScope(ctx context.Context, s DrainScope) context.Context {
	return context.WithValue(ctx, drainScopeKey{}, s)
}

func (s DrainScope) holds(c *resourcev1.ResourceClaim, node string) bool {
	for _, uid := range s.Claims {
		if c.UID == uid {
			return true
		}
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		for _, d := range s.Devices {
			if r.Driver == DriverName && r.Pool == node && r.Device == d {
				return true
			}
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
