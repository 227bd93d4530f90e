package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// MPSTenants runs one MPS control daemon per (GPU, namespace) for the prepared claims (*mps.Manager):
// a claim's MPS containers connect to their namespace's daemon on the GPU, with its own pipe directory
// and /dev/shm, so tenants of different namespaces share no socket and no shared memory. The daemon is
// started when the namespace's first MPS claim on the GPU is prepared and quit when its last one is
// unprepared.
type MPSTenants interface {
	EnsureTenant(ctx context.Context, uuid, namespace string, s mps.Settings) (mps.Status, error)
	StopTenant(ctx context.Context, uuid, namespace string) error
	Tenants() []mps.Tenant
}

// ErrMPSGPUHeldByNamespace: a claim's MPS share is on a GPU in compute mode EXCLUSIVE_PROCESS whose MPS
// shares another namespace's claims hold. In that mode one process, the MPS server of one daemon, may
// hold the GPU, so only one namespace's daemon can serve it at a time. The kubelet retries; the claim is
// prepared once the other namespace's last MPS claim on the GPU is gone.
var ErrMPSGPUHeldByNamespace = errors.New("MPS GPU held by another namespace")

// mpsGPU is what the kubelet plugin knows of an MPS GPU from the last status.
type mpsGPU struct {
	// settings are the GPU daemon's defaults in force, which its namespaces' daemons take too.
	settings mps.Settings
	// exclusive: compute mode EXCLUSIVE_PROCESS, one MPS server at a time.
	exclusive bool
}

// mpsGPUs reads each MPS GPU's daemon settings and compute mode from a status.
func mpsGPUs(status v1alpha1.GPUNodeStatus) map[string]mpsGPU {
	out := map[string]mpsGPU{}
	for _, g := range status.GPUs {
		if g.Applied == nil || g.Applied.MPS == nil {
			continue
		}
		s := mps.Settings{ActiveThreadPercentage: g.Applied.MPS.ActiveThreadPercentage}
		if q := g.Applied.MPS.PinnedMemoryLimit; q != nil {
			s.PinnedMemoryLimitMiB = q.Value() >> 20
		}
		out[g.UUID] = mpsGPU{settings: s, exclusive: g.ComputeMode == string(nvgpu.ComputeModeExclusiveProcess)}
	}
	return out
}

// mpsTenantOf marks an MPS share for its claim's namespace's daemon, when the plugin runs them.
func (p *KubeletPlugin) mpsTenantOf(d share.Device, namespace string) share.Device {
	if p.MPS != nil && d.Kind == share.KindMPS {
		d.MPSNamespace = namespace
	}
	return d
}

// ensureMPSTenant starts (or adopts) the namespace's daemon on the GPU of a unit's MPS shares, before the
// claim's CDI spec names its directories. cp is the checkpoint with this call's claims prepared so far.
func (p *KubeletPlugin) ensureMPSTenant(ctx context.Context, cp checkpoint, namespace string, devs []share.Device) error {
	if p.MPS == nil || len(devs) == 0 || devs[0].Kind != share.KindMPS {
		return nil
	}
	uuid := devs[0].GPUUUID
	g, ok := p.mpsGPUs[uuid]
	if !ok {
		return fmt.Errorf("%w: %s runs no MPS daemon now", ErrDeviceNotPublished, uuid)
	}
	if g.exclusive {
		if other := cp.mpsNamespaceOtherThan(uuid, namespace); other != "" {
			return fmt.Errorf("%w: GPU %s is in compute mode EXCLUSIVE_PROCESS, where one MPS server holds the GPU, and its MPS shares "+
				"belong to namespace %s until that namespace's last MPS claim on it goes", ErrMPSGPUHeldByNamespace, uuid, other)
		}
	}
	_, err := p.MPS.EnsureTenant(ctx, uuid, namespace, g.settings)
	return err
}

// mpsNamespaceOtherThan is a namespace other than ns whose prepared claims hold MPS shares of the GPU,
// or "".
func (cp checkpoint) mpsNamespaceOtherThan(uuid, ns string) string {
	for _, t := range cp.mpsTenants() {
		if t.GPU == uuid && t.Namespace != ns {
			return t.Namespace
		}
	}
	return ""
}

// mpsTenants are the (GPU, namespace) daemons the checkpoint's claims use, sorted.
func (cp checkpoint) mpsTenants() []mps.Tenant {
	seen := map[mps.Tenant]bool{}
	var out []mps.Tenant
	for _, pc := range cp.Claims {
		for _, d := range pc.Devices {
			if t := (mps.Tenant{GPU: d.MPSGPU, Namespace: pc.Namespace}); d.MPSGPU != "" && !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	slices.SortFunc(out, func(a, b mps.Tenant) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Namespace, b.Namespace))
	})
	return out
}

// syncMPSTenants makes the running namespace daemons those the checkpoint's claims use: it quits a
// daemon whose namespace holds no prepared MPS claim on its GPU any more (its last claim was
// unprepared, or forgotten as gone), and starts or adopts one a prepared claim uses (an agent restart
// adopts the running ones without disturbing their clients, and restarts one that died meanwhile). A
// daemon that cannot be quit (clients still connected) is kept and tried again at the next sync.
// p.mu must be held: a prepare in between could otherwise start a daemon this pass then quits.
func (p *KubeletPlugin) syncMPSTenants(ctx context.Context) {
	if p.MPS == nil {
		return
	}
	want := p.cp.mpsTenants()
	for _, t := range p.MPS.Tenants() {
		if slices.Contains(want, t) {
			continue
		}
		p.log.Info("Quitting the MPS daemon of a namespace with no MPS claim left on its GPU", "gpu", t.GPU, "namespace", t.Namespace)
		if err := p.MPS.StopTenant(ctx, t.GPU, t.Namespace); err != nil {
			p.log.Error(err, "Cannot quit a namespace's MPS daemon; trying again later", "gpu", t.GPU, "namespace", t.Namespace)
		}
	}
	for _, t := range want {
		g, ok := p.mpsGPUs[t.GPU]
		if !ok {
			// Not known before the agent's first status, or the GPU left MPS (the drain emptied it).
			continue
		}
		if _, err := p.MPS.EnsureTenant(ctx, t.GPU, t.Namespace, g.settings); err != nil {
			p.log.Error(err, "Cannot run a namespace's MPS daemon for its prepared claims", "gpu", t.GPU, "namespace", t.Namespace)
		}
	}
}

// requestMPSSync asks the sync goroutine for a pass without blocking; a pass already asked for covers it.
func (p *KubeletPlugin) requestMPSSync() {
	select {
	case p.mpsSyncRequests <- struct{}{}:
	default:
	}
}

// syncMPSTenantsOnRequest runs syncMPSTenants on each request until ctx ends.
func (p *KubeletPlugin) syncMPSTenantsOnRequest(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.mpsSyncRequests:
		}
		p.mu.Lock()
		p.syncMPSTenants(ctx)
		p.mu.Unlock()
	}
}

// mpsDeviceGPU is the GPU whose namespace daemon serves a prepared device, recorded in the checkpoint.
func mpsDeviceGPU(d share.Device) string {
	if d.MPSNamespace == "" {
		return ""
	}
	return d.GPUUUID
}
