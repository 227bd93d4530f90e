package dra

import (
	"context"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gpusharing/gpusharing/agent/owner"
)

// SetOwners makes the plugin share the node's GPUs with the device plugin through o (agent/owner): a
// claim on a GPU (or MIG instance) a device plugin pod holds is refused until that pod is gone, and the
// checkpoint's claims hold their GPUs from now on, so the device plugin's Allocate refuses them. Call it
// before Start.
func (p *KubeletPlugin) SetOwners(o *owner.Owners) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.owners = o
	p.syncOwnersLocked()
}

// takeUnits asks the owners for the units of claim c's devices of this driver. A dynamic MIG placement
// holds nothing: its instance is created for the claim, and the device plugin never advertises such an
// instance. p.mu held.
func (p *KubeletPlugin) takeUnits(ctx context.Context, c *resourcev1.ResourceClaim) error {
	if p.owners == nil {
		return nil
	}
	var units []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if _, ok := p.dynamic[r.Device]; ok {
			continue
		}
		if d, ok := p.shares[r.Device]; ok {
			units = append(units, owner.UnitOf(d))
		}
	}
	return p.owners.TakeForClaim(ctx, owner.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Units: units})
}

// syncOwnersLocked makes the checkpoint's claims DRA's side of the owners. A device recorded without its
// unit takes it from the status (a sized device's GPU, else the published share's). p.mu held.
func (p *KubeletPlugin) syncOwnersLocked() {
	if p.owners == nil {
		return
	}
	claims := make([]owner.Claim, 0, len(p.cp.Claims))
	for uid, pc := range p.cp.Claims {
		c := owner.Claim{UID: uid, Namespace: pc.Namespace, Name: pc.Name}
		for _, d := range pc.Devices {
			unit := d.Unit
			if unit == "" {
				unit = d.GPU
			}
			if s, ok := p.shares[d.Device]; unit == "" && ok {
				unit = owner.UnitOf(s)
			}
			if unit != "" && !slices.Contains(c.Units, unit) {
				c.Units = append(c.Units, unit)
			}
		}
		claims = append(claims, c)
	}
	p.owners.SetClaims(claims)
}
