package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/share"
)

// The instances of dynamic MIG GPUs are created when the kubelet prepares a claim and destroyed when it
// unprepares it. Their ledger (DynamicMIGFile in the plugin directory) is written before each NVML change
// and after it, so an agent killed at any point finds on start what it may have left:
//   - an intent (Created false) written before the create: an instance at exactly its placement and
//     profile is the interrupted create's; it is destroyed and the intent dropped, and the kubelet's
//     retry creates it again;
//   - a record whose ResourceClaim is gone (deleted while the agent was down, or before its destroy):
//     its instance is destroyed once no process uses it, and the record dropped.
// A record is dropped only after its instance is destroyed, so an instance the agent created is always
// in the ledger until it is gone: no orphan. An instance is destroyed only when NVML still shows it at
// the record's placement and profile (GPU instance ids are reused), so another claim's is never touched:
// no double.

// DynamicMIGFile is the ledger's name in the plugin directory.
const DynamicMIGFile = "dynmig.json"

var (
	// ErrPlacementTaken: NVML refused the allocated placement; something holds its slices.
	ErrPlacementTaken = errors.New("MIG placement taken")
	// ErrInstanceBusy: processes still run on the instance a claim is unprepared from.
	ErrInstanceBusy = errors.New("MIG instance in use")
)

// MIGGPU is what dynamic MIG does to the GPUs (*gpu.NVML).
type MIGGPU interface {
	Device(ctx context.Context, uuid string) (nvgpu.Device, error)
	CreateGPUInstance(ctx context.Context, uuid string, profile nvgpu.Profile, at nvgpu.Placement) (nvgpu.Instance, error)
	CreateComputeInstance(ctx context.Context, uuid string, giID int) (nvgpu.Instance, error)
	DestroyInstance(ctx context.Context, uuid string, giID int) error
	InstanceProcesses(ctx context.Context, uuid string, giID int) ([]nvgpu.Process, error)
}

// MIGRecord is one instance created, or being created, for a claim.
type MIGRecord struct {
	Claim     types.UID       `json:"claim"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Pods      []string        `json:"pods,omitempty"`
	Device    string          `json:"device"`
	GPU       string          `json:"gpu"`
	Profile   string          `json:"profile"`
	ProfileID int             `json:"profileID"`
	Placement nvgpu.Placement `json:"placement"`
	// Created says the GPU and compute instances exist (GIID, CIID, UUID); false is an intent.
	Created bool   `json:"created"`
	GIID    int    `json:"giID"`
	CIID    int    `json:"ciID"`
	UUID    string `json:"uuid,omitempty"`
}

type migLedger struct {
	Kind    string      `json:"kind"`
	Version int         `json:"version"`
	Records []MIGRecord `json:"records"`
}

const migLedgerKind = "gpusharing.io/dra-dynamic-mig"

// DynamicMIG creates and destroys the instances of dynamic MIG GPUs for the kubelet plugin, and holds
// the ledger of those it made. Its lock also serializes the node's MIG layout changes of a dynamic GPU
// with claims' creates (Around), so neither destroys what the other is creating.
type DynamicMIG struct {
	gpu  MIGGPU
	path string
	log  logr.Logger
	// writeFile writes the ledger (writeFileAtomic; a test makes it fail to stop the agent at a point).
	writeFile fileWriter

	// OnDestroy, when set, is told each instance destroyed (the health watcher forgets its mark). Set it
	// before the plugin starts.
	OnDestroy func(gpuUUID string, giID int)

	mu   sync.Mutex
	recs []MIGRecord
}

// Holds says whether GPU instance giID of the GPU was created for a claim.
func (m *DynamicMIG) Holds(gpuUUID string, giID int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.ContainsFunc(m.recs, func(r MIGRecord) bool { return r.GPU == gpuUUID && r.Created && r.GIID == giID })
}

// NewDynamicMIG loads the ledger from dir (the plugin directory).
func NewDynamicMIG(dir string, g MIGGPU, log logr.Logger) (*DynamicMIG, error) {
	m := &DynamicMIG{gpu: g, path: filepath.Join(dir, DynamicMIGFile), log: log, writeFile: writeFileAtomic}
	data, err := os.ReadFile(m.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the dynamic MIG ledger: %w", err)
	}
	var l migLedger
	if err := json.Unmarshal(data, &l); err != nil || l.Kind != migLedgerKind || l.Version != 1 {
		// Not to be moved aside: the instances it names would become orphans. The agent stops and says why.
		return nil, fmt.Errorf("the dynamic MIG ledger %s is not one this agent wrote (%v): fix or remove it after destroying its MIG instances", m.path, err)
	}
	m.recs = l.Records
	return m, nil
}

// save writes recs as the ledger and, once on disk, makes them the record. m.mu must be held.
func (m *DynamicMIG) save(recs []MIGRecord) error {
	data, err := json.MarshalIndent(migLedger{Kind: migLedgerKind, Version: 1, Records: recs}, "", "  ")
	if err != nil {
		return err
	}
	if err := m.writeFile(m.path, data, 0o600); err != nil {
		return fmt.Errorf("writing the dynamic MIG ledger: %w", err)
	}
	m.recs = recs
	return nil
}

// Records lists the ledger's records.
func (m *DynamicMIG) Records() []MIGRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.recs)
}

// Around runs f, which changes GPU uuid's MIG layout, with the placements the claims hold on it
// (intents included): f must leave them alone. No claim's instance is created or destroyed meanwhile.
func (m *DynamicMIG) Around(uuid string, f func(held []nvgpu.Placement) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var held []nvgpu.Placement
	for _, r := range m.recs {
		if r.GPU == uuid {
			held = append(held, r.Placement)
		}
	}
	return f(held)
}

func (m *DynamicMIG) find(claim types.UID, device string) int {
	return slices.IndexFunc(m.recs, func(r MIGRecord) bool { return r.Claim == claim && r.Device == device })
}

// instanceAt finds the instance NVML shows at the record's placement with its profile.
func instanceAt(d nvgpu.Device, r MIGRecord) (nvgpu.Instance, bool) {
	for _, in := range d.Instances {
		if in.Placement == r.Placement && in.ProfileID == r.ProfileID {
			return in, true
		}
	}
	return nvgpu.Instance{}, false
}

// create gives claim the instance of placement device dp, creating it unless the ledger has it, and
// returns its MIG device UUID.
func (m *DynamicMIG) create(ctx context.Context, claim types.UID, namespace, name string, pods []string, device string, dp dynPlacement) (nvgpu.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, err := m.gpu.Device(ctx, dp.GPUUUID)
	if err != nil {
		return nvgpu.Instance{}, err
	}
	if i := m.find(claim, device); i >= 0 && m.recs[i].Created {
		if in, ok := instanceAt(d, m.recs[i]); ok && in.GIID == m.recs[i].GIID && in.UUID == m.recs[i].UUID {
			return in, nil // prepared before (the kubelet asks again)
		}
		return nvgpu.Instance{}, fmt.Errorf("the MIG instance created for this claim at %s of GPU %d is gone", dp.Placement, dp.GPUIndex)
	}
	for _, r := range m.recs {
		if r.GPU == dp.GPUUUID && r.Claim != claim && r.Placement.Overlaps(dp.Placement) {
			return nvgpu.Instance{}, fmt.Errorf("%w: slices %s of GPU %d hold claim %s/%s's %s", ErrDeviceInUse, r.Placement, dp.GPUIndex, r.Namespace, r.Name, r.Profile)
		}
	}
	if i := m.find(claim, device); i >= 0 {
		// An intent of this process whose create stopped short: its instance, if any, goes first.
		if err := m.destroy(ctx, m.recs[i]); err != nil {
			return nvgpu.Instance{}, err
		}
		if d, err = m.gpu.Device(ctx, dp.GPUUUID); err != nil {
			return nvgpu.Instance{}, err
		}
	}
	profile, ok := d.Profile(dp.Profile)
	if !ok {
		return nvgpu.Instance{}, fmt.Errorf("GPU %d offers no MIG profile %s", dp.GPUIndex, dp.Profile)
	}
	rec := MIGRecord{Claim: claim, Namespace: namespace, Name: name, Pods: pods, Device: device, GPU: dp.GPUUUID,
		Profile: dp.Profile, ProfileID: profile.ID, Placement: dp.Placement, GIID: -1, CIID: nvgpu.NoComputeInstance}
	// The intent is on disk before NVML is asked: a crash from here on leaves a record to clean up.
	recs := slices.Clone(m.recs)
	if i := m.find(claim, device); i >= 0 {
		recs[i] = rec
	} else {
		recs = append(recs, rec)
	}
	if err := m.save(recs); err != nil {
		return nvgpu.Instance{}, err
	}
	gi, err := m.gpu.CreateGPUInstance(ctx, dp.GPUUUID, profile, dp.Placement)
	if err != nil {
		m.dropIntent(claim, device)
		return nvgpu.Instance{}, fmt.Errorf("%w: creating %s at memory slices %s of GPU %d: %v; instances there now: %s",
			ErrPlacementTaken, dp.Profile, dp.Placement, dp.GPUIndex, err, overlapping(d, dp.Placement))
	}
	if _, err := m.gpu.CreateComputeInstance(ctx, dp.GPUUUID, gi.GIID); err != nil {
		if derr := m.gpu.DestroyInstance(ctx, dp.GPUUUID, gi.GIID); derr != nil {
			// The intent stays: the next start or retry destroys the instance.
			return nvgpu.Instance{}, fmt.Errorf("creating the compute instance of GI %d: %w; destroying the GI: %v", gi.GIID, err, derr)
		}
		m.dropIntent(claim, device)
		return nvgpu.Instance{}, fmt.Errorf("creating the compute instance of GI %d: %w", gi.GIID, err)
	}
	if d, err = m.gpu.Device(ctx, dp.GPUUUID); err != nil {
		return nvgpu.Instance{}, err
	}
	in, ok := instanceAt(d, rec)
	if !ok || in.UUID == "" {
		return nvgpu.Instance{}, fmt.Errorf("the MIG instance created at %s of GPU %d does not read back", dp.Placement, dp.GPUIndex)
	}
	rec.Created, rec.GIID, rec.CIID, rec.UUID = true, in.GIID, in.CIID, in.UUID
	recs = slices.Clone(m.recs)
	recs[m.find(claim, device)] = rec
	if err := m.save(recs); err != nil {
		// The intent stays on disk: a restart destroys the instance, a retry in this process finds the
		// intent and its instance and starts over.
		return nvgpu.Instance{}, err
	}
	m.log.Info("Created MIG instance for ResourceClaim", "claim", namespace+"/"+name, "profile", dp.Profile, "placement", dp.Placement.String(), "gi", in.GIID, "uuid", in.UUID)
	return in, nil
}

func overlapping(d nvgpu.Device, pl nvgpu.Placement) string {
	var out []string
	for _, in := range d.Instances {
		if in.Placement.Overlaps(pl) {
			out = append(out, fmt.Sprintf("%s at %s (GI %d)", in.Profile, in.Placement, in.GIID))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return fmt.Sprint(out)
}

// dropIntent forgets an intent whose create failed with nothing left behind. m.mu must be held.
func (m *DynamicMIG) dropIntent(claim types.UID, device string) {
	if i := m.find(claim, device); i >= 0 {
		if err := m.save(slices.Delete(slices.Clone(m.recs), i, i+1)); err != nil {
			m.log.Error(err, "Keeping the intent of a failed MIG create; it is cleaned up on the next start")
		}
	}
}

// release destroys the instances of a claim, once no process runs on them, and drops their records.
func (m *DynamicMIG) release(ctx context.Context, claim types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range slices.Clone(m.recs) {
		if r.Claim != claim {
			continue
		}
		if err := m.destroy(ctx, r); err != nil {
			return err
		}
		if err := m.save(slices.DeleteFunc(slices.Clone(m.recs), func(o MIGRecord) bool { return o.Claim == r.Claim && o.Device == r.Device })); err != nil {
			return err
		}
	}
	return nil
}

// destroy destroys r's instance if NVML still shows it where r says. m.mu must be held.
func (m *DynamicMIG) destroy(ctx context.Context, r MIGRecord) error {
	d, err := m.gpu.Device(ctx, r.GPU)
	if errors.Is(err, nvgpu.ErrNotFound) {
		return nil // the GPU is gone, and its instances with it
	}
	if err != nil {
		return err
	}
	in, ok := instanceAt(d, r)
	if !ok || (r.Created && in.GIID != r.GIID) {
		return nil
	}
	procs, err := m.gpu.InstanceProcesses(ctx, r.GPU, in.GIID)
	if err != nil {
		return err
	}
	if len(procs) > 0 {
		pids := make([]int32, 0, len(procs))
		for _, p := range procs {
			pids = append(pids, p.PID)
		}
		return fmt.Errorf("%w: %s at %s of GPU %d runs processes %v; destroyed once they end", ErrInstanceBusy, r.Profile, r.Placement, d.Index, pids)
	}
	if err := m.gpu.DestroyInstance(ctx, r.GPU, in.GIID); err != nil {
		return err
	}
	if m.OnDestroy != nil {
		m.OnDestroy(r.GPU, in.GIID)
	}
	m.log.Info("Destroyed MIG instance of ResourceClaim", "claim", r.Namespace+"/"+r.Name, "profile", r.Profile, "placement", r.Placement.String(), "gi", in.GIID)
	return nil
}

// Reconcile is run on start, before the kubelet is served, and with every sweep of gone claims: it
// undoes interrupted creates and releases the instances of claims that no longer exist. A claim that
// cannot be looked up keeps its instance: not knowing is not "gone".
func (m *DynamicMIG) Reconcile(ctx context.Context, kube kubernetes.Interface) error {
	var firstErr error
	for _, r := range m.Records() {
		gone := false
		if kube != nil {
			getCtx, cancel := context.WithTimeout(ctx, claimGetTimeout)
			c, err := kube.ResourceV1().ResourceClaims(r.Namespace).Get(getCtx, r.Name, metav1.GetOptions{})
			cancel()
			switch {
			case apierrors.IsNotFound(err):
				gone = true
			case err != nil:
				firstErr = cmpErr(firstErr, fmt.Errorf("looking up ResourceClaim %s/%s: %w", r.Namespace, r.Name, err))
			default:
				gone = c.UID != r.Claim
			}
		}
		if !gone && r.Created {
			continue
		}
		m.mu.Lock()
		// Read again under the lock: a create may have finished meanwhile.
		i := m.find(r.Claim, r.Device)
		if i < 0 || (!gone && m.recs[i].Created) {
			m.mu.Unlock()
			continue
		}
		r = m.recs[i]
		err := m.destroy(ctx, r)
		if err == nil {
			err = m.save(slices.DeleteFunc(slices.Clone(m.recs), func(o MIGRecord) bool { return o.Claim == r.Claim && o.Device == r.Device }))
		}
		m.mu.Unlock()
		if err != nil {
			firstErr = cmpErr(firstErr, err)
			continue
		}
		m.log.Info("Cleaned up the MIG instance of a ResourceClaim", "claim", r.Namespace+"/"+r.Name, "claimGone", gone, "interruptedCreate", !r.Created)
	}
	return firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// prepareDynamic creates claim c's instance for placement device dp and returns the share d to prepare
// it as: the MIG device of that instance.
func (p *KubeletPlugin) prepareDynamic(ctx context.Context, c *resourcev1.ResourceClaim, device string, dp dynPlacement, d share.Device) (share.Device, error) {
	if p.MIG == nil {
		return d, fmt.Errorf("%w: %s (this agent creates no MIG instances)", ErrDeviceNotPublished, device)
	}
	in, err := p.MIG.create(ctx, c.UID, c.Namespace, c.Name, reservedPods(c), device, dp)
	if err != nil {
		return d, fmt.Errorf("%s: %w", device, err)
	}
	d.ID, d.VisibleUUID = in.UUID, in.UUID
	d.MIGGI, d.MIGCI = int32(in.GIID), int32(in.CIID)
	return d, nil
}

// reconcileMIG runs the dynamic MIG ledger's Reconcile, when the plugin has one; errors are logged.
func (p *KubeletPlugin) reconcileMIG(ctx context.Context, kube kubernetes.Interface) {
	if p.MIG == nil {
		return
	}
	if err := p.MIG.Reconcile(ctx, kube); err != nil {
		p.log.Error(err, "Reconciling dynamic MIG instances with their claims")
	}
}
