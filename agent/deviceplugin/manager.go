// Package deviceplugin serves the kubelet device plugin API (v1beta1) for the GPUs of one node: one gRPC
// server and one registration per resource name (exclusive GPUs, time-slice replicas, MPS replicas, MIG
// instances by profile, shim-shared GPUs). What it advertises is computed from GPUNode.status alone
// (share.DevicesFromStatus), so it depends on the API and not on how the agent applies sharing.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Manager runs one plugin per resource name and keeps them in step with the device map it is given:
//   - a new resource is served, then registered with the kubelet;
//   - a resource whose device set or device kind/settings changed is served anew and re-registered;
//   - a change of health only is pushed through the open ListAndWatch streams;
//   - a resource left without devices is advertised empty (so its capacity drops at once) and stopped;
//   - when kubelet.sock is re-created (a kubelet restart) or a plugin's socket vanished, every resource is
//     served anew and re-registered; a failed registration is retried on every poll;
//   - a registered plugin whose last ListAndWatch stream the kubelet closed registers again (the kubelet
//     drops such a plugin, and can drop a freshly re-registered one when the old stream ends late).
//
// Cordon and Uncordon hide and restore one GPU's devices (its MIG instances included) for a drain. A
// cordoned GPU's devices that pods still hold stay advertised until the kubelet no longer lists them
// (SetPodResources): the scheduler counts those pods' requests against the node, so hiding their
// devices too would make the node look fuller than it is and keep a drained pod's replacement Pending
// even where another GPU has room. The kubelet never allocates a device it has allocated already, and
// Allocate refuses a cordoned GPU's devices anyway.
type Manager struct {
	cfg share.Config
	// cdi writes the CDI spec of the advertised devices (cdi.go); nil where cfg names no CDI directory
	// or no device nodes.
	cdi *cdiWriter
	// cdiMissing is why devices were left out of the last spec written, as last logged.
	cdiMissing string

	mu       sync.Mutex
	desired  map[share.ResourceName][]share.Device
	cordoned map[string]bool
	plugins  map[share.ResourceName]*entry
	kubelet  kubeletIdentity
	// pods is the kubelet's PodResources API; nil hides every device of a cordoned GPU.
	pods PodResourcesLister
	// held are the devices the kubelet had allocated to pods at the latest look while a GPU was
	// cordoned; nil when that look failed, which hides every device of a cordoned GPU.
	held        map[heldDevice]bool
	heldFailing bool
	// topology ranks the GPUs a container's shares go to; nil chooses by use and order alone.
	topology *topologySource
	// servedByDRA are the resource names DRA serves on this node (DeviceClasses naming them as their
	// extended resource); they are never advertised, so no share goes to a pod both ways. With
	// awaitDRA, nothing is advertised until the first SetServedByDRA.
	servedByDRA map[share.ResourceName]bool
	awaitDRA    bool
	// owners says which GPUs DRA holds where the kubelet plugin serves beside the device plugin: their
	// devices are advertised Unhealthy and Allocate refuses them (agent/owner). Nil where only the
	// device plugin serves.
	owners *owner.Owners
}

type entry struct {
	p          *plugin
	registered bool
	// registeredAt is when the kubelet last accepted the registration.
	registeredAt time.Time
}

// streamGrace is how long a registered plugin may go without an open ListAndWatch stream before it
// registers again. The kubelet opens the stream within milliseconds of a registration; when a resource
// re-registers, the kubelet's handling of the old stream's end can drop the new client before its stream
// reaches the plugin (seen with a real kubelet 1.36 in the e2e), and then no stream ever ends to tell us.
const streamGrace = 5 * time.Second

// NewManager returns a Manager with nothing advertised. Zero fields of cfg take their defaults; an
// invalid configuration (see share.Config.Validate) is refused.
func NewManager(cfg share.Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var cdi *cdiWriter
	if cfg.CDIDir != "" && cfg.Nodes != nil {
		w, err := newCDIWriter(cfg.CDIDir)
		if err != nil {
			return nil, err
		}
		cdi = w
	}
	return &Manager{
		cdi:      cdi,
		cfg:      cfg.WithDefaults(),
		desired:  map[share.ResourceName][]share.Device{},
		cordoned: map[string]bool{},
		plugins:  map[share.ResourceName]*entry{},
	}, nil
}

// Config is the configuration in force, defaults filled in.
func (m *Manager) Config() share.Config { return m.cfg }

// Update makes devices the node's advertised devices (less cordoned GPUs) and returns the errors of
// serving or registering; a resource that could not register keeps being retried by Run.
func (m *Manager) Update(ctx context.Context, devices map[share.ResourceName][]share.Device) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.desired = make(map[share.ResourceName][]share.Device, len(devices))
	for res, devs := range devices {
		m.desired[res] = append([]share.Device(nil), devs...)
	}
	var errs []error
	if m.cdi != nil {
		// Written before any device is advertised: Allocate names these CDI devices.
		spec, missing, err := cdiSpec(m.cfg.Nodes, m.desired)
		if err == nil {
			err = m.cdi.write(spec)
		}
		errs = append(errs, err)
		// Not an error of the update: every other GPU is served, and Allocate refuses these with the same
		// reason. Logged when the list changes, not on every pass.
		if why := errors.Join(missing...); fmt.Sprint(why) != m.cdiMissing {
			m.cdiMissing = fmt.Sprint(why)
			if why != nil {
				logr.FromContextOrDiscard(ctx).Error(why, "Devices left out of the device plugin's CDI spec: their containers cannot get them")
			}
		}
	}
	return errors.Join(append(errs, m.reconcileLocked(ctx))...)
}

// UpdateFromStatus is Update(DevicesFromStatus(status)).
func (m *Manager) UpdateFromStatus(ctx context.Context, status v1alpha1.GPUNodeStatus) error {
	return m.Update(ctx, share.DevicesFromStatus(status, m.cfg))
}

// SetPodResources gives the manager the kubelet's PodResources API, so a cordoned GPU's devices that
// pods hold stay advertised. Call it before Run.
func (m *Manager) SetPodResources(l PodResourcesLister) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pods = l
}

// SetOwners makes the manager share its GPUs with the DRA kubelet plugin through o: a GPU (or MIG
// instance) a prepared claim holds has its devices advertised Unhealthy, so the kubelet does not pick
// them, and Allocate refuses them; every Allocate is recorded in o, so a claim on its GPU waits. Call it
// before Run.
func (m *Manager) SetOwners(o *owner.Owners) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.owners = o
}

// Cordon stops advertising every device of the GPU (replicas and MIG instances alike) that no pod holds,
// and each held one once its pod has gone, until Uncordon, whatever later Updates say. Allocate refuses
// the GPU's devices from now on.
func (m *Manager) Cordon(ctx context.Context, gpuUUID string) error {
	held, herr := listHeld(ctx, m.podResources())
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cordoned[gpuUUID] = true
	m.setHeldLocked(ctx, held, herr)
	logr.FromContextOrDiscard(ctx).Info("Cordoned GPU in the device plugin", "gpu", gpuUUID)
	return m.reconcileLocked(ctx)
}

// Uncordon advertises the GPU's devices again, as the latest Update describes them.
func (m *Manager) Uncordon(ctx context.Context, gpuUUID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.cordoned, gpuUUID)
	m.setHeldLocked(ctx, m.held, nil)
	logr.FromContextOrDiscard(ctx).Info("Uncordoned GPU in the device plugin", "gpu", gpuUUID)
	return m.reconcileLocked(ctx)
}

// AwaitServedByDRA makes the manager advertise nothing until the first SetServedByDRA: where DRA
// serves some names as extended resources, advertising them first and withdrawing them later would let
// the kubelet hand a share to a pod that a claim then gets too. Call it before Run.
func (m *Manager) AwaitServedByDRA() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.awaitDRA = true
}

// SetServedByDRA names the extended resources DRA serves on this node, which the manager stops (or never
// starts) advertising; a name no longer listed is advertised again. A pod asking for such a name is
// scheduled through DRA only while the node's allocatable holds none of it, and a share advertised by
// both would go to a device plugin pod and a claim at once.
func (m *Manager) SetServedByDRA(ctx context.Context, names map[share.ResourceName]bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.servedByDRA != nil && maps.Equal(m.servedByDRA, names) {
		return nil
	}
	m.servedByDRA = maps.Clone(names)
	if m.servedByDRA == nil {
		m.servedByDRA = map[share.ResourceName]bool{}
	}
	logr.FromContextOrDiscard(ctx).Info("Resources served through DRA are left to it", "resources", slices.Sorted(maps.Keys(m.servedByDRA)))
	return m.reconcileLocked(ctx)
}

// Cordoned lists the cordoned GPUs, sorted.
func (m *Manager) Cordoned() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.cordoned))
}

// Advertised is what the plugins serve now, per resource.
func (m *Manager) Advertised() map[share.ResourceName][]share.Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[share.ResourceName][]share.Device{}
	for res, e := range m.plugins {
		devs, _ := e.p.snapshot()
		out[res] = append([]share.Device(nil), devs...)
	}
	return out
}

// Run watches the kubelet until ctx ends, then stops every plugin and removes its socket.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.kubelet = statKubelet(m.cfg.KubeletSocket())
	var ownersChanged <-chan struct{}
	if m.owners != nil {
		ownersChanged = m.owners.Changed()
	}
	m.mu.Unlock()
	t := time.NewTicker(m.cfg.KubeletPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.stopAll()
			return nil
		case <-ownersChanged:
			// A claim was prepared or unprepared: its GPU's devices turn Unhealthy or Healthy.
			m.mu.Lock()
			err := m.reconcileLocked(ctx)
			m.mu.Unlock()
			if err != nil {
				logr.FromContextOrDiscard(ctx).Error(err, "Device plugin update failed; retrying")
			}
		case <-t.C:
			if err := m.checkKubelet(ctx); err != nil {
				logr.FromContextOrDiscard(ctx).Error(err, "Device plugin registration failed; retrying")
			}
		}
	}
}

func (m *Manager) checkKubelet(ctx context.Context) error {
	// The kubelet is asked outside the lock: Allocate must not wait for it.
	var held map[heldDevice]bool
	var herr error
	if m.anyCordoned() {
		held, herr = listHeld(ctx, m.podResources())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.setHeldLocked(ctx, held, herr)
	now := statKubelet(m.cfg.KubeletSocket())
	restarted := now.restartedSince(m.kubelet)
	m.kubelet = now
	if !now.present() {
		// The kubelet is down; its restart will be seen when kubelet.sock comes back.
		return nil
	}
	log := logr.FromContextOrDiscard(ctx)
	if restarted {
		log.Info("Kubelet socket re-created; re-registering every resource", "socket", m.cfg.KubeletSocket())
	}
	var errs []error
	for res, e := range m.plugins {
		switch {
		case restarted || !e.p.socketExists():
			devs, _ := e.p.snapshot()
			errs = append(errs, m.restartLocked(ctx, res, devs))
		case !e.registered:
			errs = append(errs, m.registerLocked(ctx, e))
		case e.p.takeLost():
			log.Info("Kubelet closed the device plugin's ListAndWatch stream; registering again", "resource", string(res))
			errs = append(errs, m.registerLocked(ctx, e))
		case e.p.openStreams() == 0 && time.Since(e.registeredAt) > streamGrace:
			log.Info("Kubelet opened no ListAndWatch stream since the registration; registering again", "resource", string(res), "registered", e.registeredAt)
			errs = append(errs, m.registerLocked(ctx, e))
		}
	}
	errs = append(errs, m.reconcileLocked(ctx))
	return errors.Join(errs...)
}

func (m *Manager) podResources() PodResourcesLister {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods
}

func (m *Manager) anyCordoned() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cordoned) > 0
}

// setHeldLocked records the kubelet's latest answer; a failed look hides every device of a cordoned GPU
// (the scheduler then under-counts the node, which is safe) and is logged when it starts failing.
func (m *Manager) setHeldLocked(ctx context.Context, held map[heldDevice]bool, err error) {
	if len(m.cordoned) == 0 {
		m.held, m.heldFailing = nil, false
		return
	}
	if err != nil && !m.heldFailing {
		logr.FromContextOrDiscard(ctx).Error(err, "Cannot tell which devices of a cordoned GPU pods still hold; hiding all of them")
	}
	m.held, m.heldFailing = held, err != nil
}

// effectiveLocked is the desired map without the devices of cordoned GPUs that no pod holds, without
// empty resources and without the resources DRA serves (all of them until it is known which, where the
// manager awaits that).
func (m *Manager) effectiveLocked() map[share.ResourceName][]share.Device {
	out := map[share.ResourceName][]share.Device{}
	if m.awaitDRA && m.servedByDRA == nil {
		return out
	}
	for res, devs := range m.desired {
		if m.servedByDRA[res] {
			continue
		}
		var keep []share.Device
		for _, d := range devs {
			if m.owners != nil {
				if _, ok := m.owners.HeldByDRA(owner.UnitOf(d)); ok {
					d.Healthy = false
				}
			}
			switch {
			case !m.cordoned[d.GPUUUID]:
				keep = append(keep, d)
			case m.held[heldDevice{res, d.ID}]:
				d.Held = true
				keep = append(keep, d)
			}
		}
		if len(keep) > 0 {
			out[res] = keep
		}
	}
	return out
}

func (m *Manager) reconcileLocked(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	want := m.effectiveLocked()
	var errs []error
	for res, devs := range want {
		e := m.plugins[res]
		cur := []share.Device(nil)
		if e != nil {
			cur, _ = e.p.snapshot()
		}
		switch {
		case e == nil:
			log.Info("Serving device plugin resource", "resource", string(res), "devices", len(devs))
			errs = append(errs, m.restartLocked(ctx, res, devs))
		case !sameDevices(cur, devs):
			// Every later change (devices added or gone, their settings, their health) goes through the
			// open ListAndWatch streams: the kubelet replaces the resource's device list with each one it
			// is sent, and Allocate reads the list at call time. Registering again would race the old
			// stream's end in the kubelet, which can leave the new client's devices unhealthy with its
			// stream still open (docs/deviceplugin.md).
			if !sameSpecs(cur, devs) {
				log.Info("Device plugin resource changed", "resource", string(res), "devices", len(devs))
			}
			e.p.setDevices(devs)
		}
	}
	for res, e := range m.plugins {
		if _, ok := want[res]; ok {
			continue
		}
		log.Info("Device plugin resource has no devices left; stopping it", "resource", string(res))
		e.p.setDevices(nil)
		e.p.shutdown()
		delete(m.plugins, res)
	}
	return errors.Join(errs...)
}

// restartLocked replaces the resource's plugin (if any) with a new one serving devs and registers it.
func (m *Manager) restartLocked(ctx context.Context, res share.ResourceName, devs []share.Device) error {
	if old := m.plugins[res]; old != nil {
		old.p.shutdown()
		delete(m.plugins, res)
	}
	p := newPlugin(m.cfg, res, devs, logr.FromContextOrDiscard(ctx))
	p.topology = m.topology
	p.owners = m.owners
	if err := p.start(); err != nil {
		// Not kept: the next reconcile or kubelet poll starts it again.
		return err
	}
	e := &entry{p: p}
	m.plugins[res] = e
	return m.registerLocked(ctx, e)
}

func (m *Manager) registerLocked(ctx context.Context, e *entry) error {
	if err := register(ctx, m.cfg, e.p); err != nil {
		e.registered = false
		return err
	}
	e.registered = true
	e.registeredAt = time.Now()
	logr.FromContextOrDiscard(ctx).Info("Registered device plugin with the kubelet", "resource", string(e.p.resource))
	return nil
}

func (m *Manager) stopAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for res, e := range m.plugins {
		e.p.shutdown()
		delete(m.plugins, res)
	}
}
