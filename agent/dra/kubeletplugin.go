package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/clock"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	nvgpu "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Default kubelet paths of the plugin.
const (
	// DefaultPluginDir holds the plugin's gRPC socket and its checkpoint.
	DefaultPluginDir = "/var/lib/kubelet/plugins/" + DriverName
	// DefaultRegistryDir is where the kubelet looks for plugin registration sockets.
	DefaultRegistryDir = kubeletplugin.KubeletRegistryDir
	// CheckpointFile is the checkpoint's name in the plugin directory.
	CheckpointFile = "checkpoint.json"
)

var (
	// ErrDeviceNotPublished: a claim names a device this node does not publish now (its GPU is drained,
	// unhealthy or shared otherwise since the scheduler allocated it). The kubelet retries; the pod waits.
	ErrDeviceNotPublished = errors.New("device not published on this node")
	// ErrDeviceInUse: a device is prepared for another claim already; the plugin is the last line of
	// defence against two workloads on one share.
	ErrDeviceInUse = errors.New("device prepared for another claim")
	// ErrOtherPool: a claim's device of this driver is in another node's pool.
	ErrOtherPool = errors.New("device of another node's pool")
)

// PluginConfig says where the kubelet plugin serves and writes.
type PluginConfig struct {
	// PluginDir holds the DRA gRPC socket (dra.sock) and the checkpoint (default DefaultPluginDir).
	PluginDir string
	// RegistryDir is the kubelet's plugin registration directory (default DefaultRegistryDir).
	RegistryDir string
	// CDIDir is where the CDI specs of prepared claims are written (default DefaultCDIDir).
	CDIDir string
	// GoneClaimsInterval is how often the checkpoint's claims are looked up to forget those whose
	// ResourceClaim is gone (zero: DefaultGoneClaimsInterval); they are looked up once on Start too.
	GoneClaimsInterval time.Duration
	// ContextReserve is the device memory charged to each CUDA process of a sized claim for its context
	// (bytes; the agent's --context-reserve, DefaultContextReserve): an MPS client's pinned memory limit
	// is its claim less this (SizedLimits). Zero charges nothing.
	ContextReserve int64
}

// WithDefaults fills the zero fields.
func (c PluginConfig) WithDefaults() PluginConfig {
	if c.PluginDir == "" {
		c.PluginDir = DefaultPluginDir
	}
	if c.RegistryDir == "" {
		c.RegistryDir = DefaultRegistryDir
	}
	if c.CDIDir == "" {
		c.CDIDir = DefaultCDIDir
	}
	return c
}

// KubeletPlugin is the DRA kubelet plugin: it prepares a claim's devices by writing a CDI spec with what
// the device plugin's Allocate gives the same shares (share.ContainerEdits), and keeps a
// checkpoint of the claims it prepared. The agent tells it every status it computes (Update), as it tells
// the device plugin; a device the status does not publish is not prepared.
type KubeletPlugin struct {
	node string
	cfg  PluginConfig
	dp   share.Config
	log  logr.Logger

	// writeFile writes the checkpoint (writeFileAtomic; a test makes it fail).
	writeFile fileWriter
	// cdi writes and removes the claims' CDI spec files.
	cdi *cdiSpecs

	// OnChange, when set, is called after the prepared claims change, so the GPUNode status lists them;
	// it must not block. Set it before Start.
	OnChange func()
	// PodPriority, when set, reads a pod's resolved priority (its spec.priority; ok false when the pod
	// cannot be read): on an MPS or shim GPU with production classes a claim is production only when
	// every pod it is reserved for reaches the threshold. Unset, or unread, its pods are opportunistic. Set it
	// before Start.
	PodPriority func(ctx context.Context, namespace, name string) (priority int32, ok bool)

	// MIG, when set, creates and destroys the instances of dynamic MIG GPUs' placement devices
	// (dynmigprepare.go). Set it before Start.
	MIG *DynamicMIG

	// MPS, when set, runs one MPS daemon per (GPU, namespace) for the claims' MPS shares
	// (mpstenants.go); unset, MPS claims connect to their GPU's daemon as device plugin pods do. Set it
	// before Start.
	MPS MPSTenants

	// Clock stamps the reads of the node's claims (ClaimView.SyncedAt); nil is the real clock. It must be
	// the accounting's clock, whose reads the guard compares with them. Set it before Start.
	Clock clock.PassiveClock

	// owners, where the device plugin serves beside this plugin, refuses a claim on a GPU a device
	// plugin pod holds and tells the device plugin which GPUs the prepared claims hold (agent/owner; nil
	// where DRA serves alone). Set through SetOwners.
	owners *owner.Owners

	// syncRequests carries RequestClaimSync to the goroutine that reads the node's claims.
	syncRequests chan struct{}
	// mpsSyncRequests asks for a pass of syncMPSTenants.
	mpsSyncRequests chan struct{}

	mu     sync.Mutex
	shares map[string]share.Device
	// dynamic are the placement devices of dynamic MIG GPUs the status publishes.
	dynamic map[string]dynPlacement
	// gpus are the node's GPU uuids by index, from the last status: a sized device's GPU by its name.
	gpus map[int32]string
	// mpsGPUs are the MPS GPUs' daemon settings and compute modes, from the last status.
	mpsGPUs map[string]mpsGPU
	// api are the claims with sized devices allocated in this node's pool, as last read (SyncClaims),
	// and syncedAt when that read began.
	api      map[types.UID]apiClaim
	syncedAt time.Time
	// unprepared are claims the kubelet unprepared that the API server may still show allocated here
	// (until the ResourceClaim controller deallocates them): no read brings them back into the view.
	unprepared map[types.UID]bool
	// cp is the checkpoint as last written: it changes only through commit.
	cp checkpoint
}

// NewKubeletPlugin loads the checkpoint of node's plugin. dp must be the device plugin's configuration
// (host paths of the MPS pipe directories, the scheduler sockets and the shim). A checkpoint that cannot
// be read is moved aside (its claims' spec files are still removed by uid on unprepare) rather than
// keeping the agent from starting.
func NewKubeletPlugin(node string, cfg PluginConfig, dp share.Config, log logr.Logger) (*KubeletPlugin, error) {
	if node == "" {
		return nil, errors.New("the DRA kubelet plugin needs the node name")
	}
	cfg = cfg.WithDefaults()
	specs, err := newCDISpecs(cfg.CDIDir)
	if err != nil {
		return nil, err
	}
	p := &KubeletPlugin{node: node, cfg: cfg, dp: dp.WithDefaults(), log: log, writeFile: writeFileAtomic, cdi: specs,
		syncRequests: make(chan struct{}, 1), mpsSyncRequests: make(chan struct{}, 1)}
	path := p.checkpointPath()
	cp, err := readCheckpoint(path, node)
	if errors.Is(err, errCorruptCheckpoint) {
		log.Error(err, "Moving the unreadable DRA checkpoint aside", "path", path)
		if rerr := os.Rename(path, path+".corrupt"); rerr != nil {
			return nil, fmt.Errorf("%w; moving it aside: %v", err, rerr)
		}
	} else if err != nil {
		return nil, err
	}
	p.cp = cp
	return p, nil
}

func (p *KubeletPlugin) checkpointPath() string {
	return filepath.Join(p.cfg.PluginDir, CheckpointFile)
}

// commit writes next as the checkpoint and, only once it is on disk, makes it the plugin's record; on an
// error the record stays what the file holds. p.mu must be held.
func (p *KubeletPlugin) commit(next checkpoint) error {
	if err := writeCheckpoint(p.writeFile, p.checkpointPath(), next); err != nil {
		return err
	}
	p.cp = next
	p.syncOwnersLocked()
	if p.OnChange != nil {
		p.OnChange()
	}
	return nil
}

// Update takes the shares a node status publishes, with no fixed-layout change pending (UpdateNode).
func (p *KubeletPlugin) Update(status v1alpha1.GPUNodeStatus) {
	p.update(status, nil)
}

// UpdateNode takes the shares the node's status publishes, less the placements a pending fixed-layout
// change of a dynamic MIG GPU creates on (the slices withhold them too); the reconciler's every status
// reaches it through Driver.PublishStatus.
func (p *KubeletPlugin) UpdateNode(node *v1alpha1.GPUNode) {
	p.update(node.Status, pendingLayouts(node))
}

func (p *KubeletPlugin) update(status v1alpha1.GPUNodeStatus, pending map[string][]nvgpu.Placement) {
	shares, dynamic := shares(status, p.dp, pending), dynamicPlacements(status, pending)
	gpus := make(map[int32]string, len(status.GPUs))
	for _, g := range status.GPUs {
		gpus[g.Index] = g.UUID
	}
	mpsGPUs := mpsGPUs(status)
	p.mu.Lock()
	p.shares, p.dynamic, p.gpus = shares, dynamic, gpus
	// A claim of a checkpoint written without units is placed once a status names its devices.
	p.syncOwnersLocked()
	mpsChanged := !maps.Equal(p.mpsGPUs, mpsGPUs)
	p.mpsGPUs = mpsGPUs
	p.mu.Unlock()
	if mpsChanged {
		// The first status after a start names the settings the namespace daemons of the checkpoint's
		// claims are adopted with.
		p.requestMPSSync()
	}
}

// Prepared lists the uids of the claims the checkpoint holds, sorted.
func (p *KubeletPlugin) Prepared() []types.UID {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]types.UID, 0, len(p.cp.Claims))
	for uid := range p.cp.Claims {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

// Start serves the plugin to the kubelet (registration and the DRA v1 and v1beta1 services) until ctx
// ends or the returned helper is stopped. kube reads the ResourceClaims the kubelet names. Before it
// serves, the checkpoint's claims whose ResourceClaim is gone are forgotten (ForgetGoneClaims), so a
// device freed while the agent was down is not refused, and the claims allocated in this node's pool are
// read (SyncClaims), so the claim guard knows them whatever the checkpoint holds; both within
// firstSweepTimeout. Then the sweep runs every GoneClaimsInterval, and the read on RequestClaimSync, until
// ctx ends.
func (p *KubeletPlugin) Start(ctx context.Context, kube kubernetes.Interface) (*kubeletplugin.Helper, error) {
	// The helper listens in these directories but does not make them; the kubelet makes only its own
	// registry, and not before it first looks for plugins.
	for _, dir := range []string{p.cfg.PluginDir, p.cfg.RegistryDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("creating the DRA plugin directory: %w", err)
		}
	}
	firstCtx, cancel := context.WithTimeout(ctx, firstSweepTimeout)
	// Errors are logged per claim; what could not be looked up is kept for the next sweep.
	_, _ = p.ForgetGoneClaims(firstCtx, kube)
	p.reconcileMIG(firstCtx, kube)
	p.mu.Lock()
	p.syncMPSTenants(firstCtx)
	p.mu.Unlock()
	if err := p.SyncClaims(firstCtx, kube); err != nil {
		// The guard asks again for what it cannot judge.
		p.log.Error(err, "Cannot read this node's ResourceClaims; pods on sized GPUs not known stay unjudged")
	}
	cancel()
	go p.syncClaimsOnRequest(ctx, kube)
	go p.syncMPSTenantsOnRequest(ctx)
	interval := p.cfg.GoneClaimsInterval
	if interval <= 0 {
		interval = DefaultGoneClaimsInterval
	}
	go p.forgetGoneClaimsEvery(ctx, kube, interval)
	return kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(p.node),
		kubeletplugin.KubeClient(kube),
		kubeletplugin.PluginDataDirectoryPath(p.cfg.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(p.cfg.RegistryDir),
	)
}

// PrepareResourceClaims writes a CDI spec per claim and returns its device IDs (kubeletplugin.DRAPlugin).
// A claim prepared before (by this process or the one before a restart) gets the same answer. When the
// checkpoint cannot be written the call fails as a whole, no claim of it is recorded and the spec files
// written for them are removed: the kubelet retries, and the retry prepares and writes them again.
func (p *KubeletPlugin) PrepareResourceClaims(ctx context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	// Claims of this call are recorded in next, so two of them cannot take one device.
	next := p.cp.clone()
	var fresh []types.UID
	for _, c := range claims {
		pc, isFresh, err := p.prepare(ctx, next, c)
		if _, recorded := p.cp.Claims[c.UID]; err != nil && !recorded && p.owners != nil {
			// What it took for itself goes back.
			p.owners.Release(c.UID)
		}
		if err != nil {
			out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
			// A namespace daemon it started for no recorded claim is quit.
			p.requestMPSSync()
			continue
		}
		if isFresh {
			next.Claims[c.UID] = pc
			fresh = append(fresh, c.UID)
			delete(p.unprepared, c.UID)
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: resultDevices(pc)}
	}
	if len(fresh) > 0 {
		// The checkpoint is written before the kubelet hears of success: a claim the kubelet thinks
		// prepared is always one a restarted agent can unprepare.
		if err := p.commit(next); err != nil {
			p.requestMPSSync()
			for _, uid := range fresh {
				if p.owners != nil {
					p.owners.Release(uid)
				}
				if rerr := p.cdi.remove(uid); rerr != nil {
					p.log.Error(rerr, "Removing the CDI spec of a ResourceClaim whose preparation was not recorded", "claimUID", uid)
				}
			}
			return nil, err
		}
	}
	return out, nil
}

// prepare builds and writes one claim's CDI spec; fresh says the checkpoint cp lacks the claim.
func (p *KubeletPlugin) prepare(ctx context.Context, cp checkpoint, c *resourcev1.ResourceClaim) (preparedClaim, bool, error) {
	if pc, ok := cp.Claims[c.UID]; ok {
		// The kubelet may ask again (its own restart): the same answer, the spec file written again if it
		// went missing or no longer reads as a valid spec (cut short where the CDI directory is on a disk
		// that lost power).
		if len(pc.Spec.Devices) > 0 && !p.cdi.valid(c.UID) {
			if err := p.cdi.write(c.UID, &pc.Spec); err != nil {
				return pc, false, fmt.Errorf("writing CDI spec: %w", err)
			}
		}
		return pc, false, nil
	}
	if c.Status.Allocation == nil {
		return preparedClaim{}, false, errors.New("not allocated")
	}
	requests, byRequest, err := p.ourResults(cp, c)
	if err != nil {
		return preparedClaim{}, false, err
	}
	// Before anything is made for the claim: a GPU the device plugin holds is not prepared.
	if err := p.takeUnits(ctx, c); err != nil {
		return preparedClaim{}, false, err
	}
	pc := preparedClaim{Namespace: c.Namespace, Name: c.Name, Pods: reservedPods(c), PodUIDs: reservedPodUIDs(c)}
	var cdiDevices []cdispec.Device
	for _, unit := range gpuSets(c.Spec.Devices.Constraints, requests) {
		var results []resourcev1.DeviceRequestAllocationResult
		for _, req := range unit {
			results = append(results, byRequest[req]...)
		}
		devs, sized, err := p.unitShares(ctx, c, results)
		if err != nil {
			return preparedClaim{}, false, err
		}
		// One container asking for these shares gets what one container asking the device plugin for
		// them gets: the same function decides it.
		resp, err := share.ContainerEdits(p.dp, devs)
		if err != nil {
			return preparedClaim{}, false, fmt.Errorf("request %s: %w", strings.Join(unit, ", "), err)
		}
		// The directories the edits name are the namespace daemon's: it runs before the spec exists.
		if err := p.ensureMPSTenant(ctx, cp, c.Namespace, devs); err != nil {
			return preparedClaim{}, false, fmt.Errorf("request %s: %w", strings.Join(unit, ", "), err)
		}
		name := cdiDeviceName(c.UID, strings.Join(unit, "_"))
		cdiDevices = append(cdiDevices, cdispec.Device{Name: name, ContainerEdits: cdiEditsOf(resp)})
		for i, r := range results {
			d := sized[i]
			d.Requests, d.Pool, d.Device, d.ShareID = []string{r.Request}, r.Pool, r.Device, r.ShareID
			d.MPSGPU = mpsDeviceGPU(devs[i])
			d.Unit = owner.UnitOf(devs[i])
			// The edits are one CDI device, named on the first device only: a container gets them once
			// however many shares it holds (several MPS shares add up in one client). A GPU set's first
			// device stands for each of its requests, so a container that names any of them gets every
			// GPU of the set in one environment.
			if i == 0 {
				d.CDIDeviceIDs = []string{CDIID(name)}
				if len(unit) > 1 {
					d.Requests = slices.Clone(unit)
				}
			}
			pc.Devices = append(pc.Devices, d)
		}
	}
	if len(cdiDevices) > 0 {
		spec, err := newCDISpec(cdiDevices)
		if err != nil {
			return preparedClaim{}, false, err
		}
		if err := p.cdi.write(c.UID, &spec); err != nil {
			return preparedClaim{}, false, fmt.Errorf("writing CDI spec: %w", err)
		}
		pc.Spec = spec
	}
	return pc, true, nil
}

// ourResults groups the claim's results of this driver by request, requests in allocation order;
// results of other drivers are theirs to prepare. A result in another pool, or of a whole device the
// checkpoint has prepared for another claim, is refused.
func (p *KubeletPlugin) ourResults(cp checkpoint, c *resourcev1.ResourceClaim) ([]string, map[string][]resourcev1.DeviceRequestAllocationResult, error) {
	var requests []string
	byRequest := map[string][]resourcev1.DeviceRequestAllocationResult{}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != p.node {
			return nil, nil, fmt.Errorf("%w: %s/%s (this is %s)", ErrOtherPool, r.Pool, r.Device, p.node)
		}
		// A sized device is allocated to many claims, each with a share id; the scheduler keeps their sum
		// within its capacity.
		if owner := cp.holder(r.Device, c.UID); owner != "" && r.ShareID == nil {
			return nil, nil, fmt.Errorf("%w: %s is prepared for claim %s", ErrDeviceInUse, r.Device, owner)
		}
		if _, ok := byRequest[r.Request]; !ok {
			requests = append(requests, r.Request)
		}
		byRequest[r.Request] = append(byRequest[r.Request], r)
	}
	return requests, byRequest, nil
}

// unitShares is the share each result of one GPU set stands for: a dynamic MIG placement created now,
// a sized share with the limits of its consumed capacity, an MPS share with the claim's class. sized
// holds, per result, the amounts a sized share consumed (zero for the others).
func (p *KubeletPlugin) unitShares(ctx context.Context, c *resourcev1.ResourceClaim, results []resourcev1.DeviceRequestAllocationResult) (devs []share.Device, sized []preparedDevice, err error) {
	devs = make([]share.Device, 0, len(results))
	sized = make([]preparedDevice, len(results))
	for i, r := range results {
		d, ok := p.shares[r.Device]
		if !ok {
			return nil, nil, fmt.Errorf("%w: %s", ErrDeviceNotPublished, r.Device)
		}
		if dp, ok := p.dynamic[r.Device]; ok {
			md, err := p.prepareDynamic(ctx, c, r.Device, dp, d)
			if err != nil {
				return nil, nil, err
			}
			devs = append(devs, md)
			continue
		}
		if d.Sized {
			if d, err = SizedLimits(d, r.ConsumedCapacity, p.cfg.ContextReserve); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", r.Device, err)
			}
			sized[i] = sizedAmounts(d.GPUUUID, r.ConsumedCapacity)
		}
		if d.QoS != nil && d.Kind == share.KindMPS {
			// Only MPS takes the class from the environment; under the shim the scheduler classifies
			// each process by its pod itself.
			d.Opportunistic = !p.production(ctx, c, d.QoS)
		}
		devs = append(devs, p.mpsTenantOf(d, c.Namespace))
	}
	return devs, sized, nil
}

// holder is the claim other than self the checkpoint has device prepared for, or "".
func (cp checkpoint) holder(device string, self types.UID) types.UID {
	for uid, pc := range cp.Claims {
		if uid == self {
			continue
		}
		for _, d := range pc.Devices {
			if d.Device == device {
				return uid
			}
		}
	}
	return ""
}

func resultDevices(pc preparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(pc.Devices))
	for _, d := range pc.Devices {
		out = append(out, kubeletplugin.Device{Requests: d.Requests, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs, ShareID: d.ShareID})
	}
	return out
}

// UnprepareResourceClaims removes the claims' CDI specs and forgets them (kubeletplugin.DRAPlugin). A
// claim never prepared, or unprepared already, is no error. When the checkpoint cannot be written the call
// fails and the claims stay recorded (their specs are gone already): the kubelet retries, and the retry
// writes the checkpoint without them.
func (p *KubeletPlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	next := p.cp.clone()
	changed := false
	for _, c := range claims {
		// A dynamic MIG instance goes first: while processes run on it, the claim stays prepared.
		if p.MIG != nil {
			if err := p.MIG.release(ctx, c.UID); err != nil {
				out[c.UID] = fmt.Errorf("claim %s: %w", c.String(), err)
				continue
			}
		}
		// By uid, whether or not the checkpoint knows the claim: a spec left by a lost checkpoint goes too.
		if err := p.cdi.remove(c.UID); err != nil {
			out[c.UID] = fmt.Errorf("removing the CDI spec of claim %s: %w", c.String(), err)
			continue
		}
		if _, ok := next.Claims[c.UID]; ok {
			delete(next.Claims, c.UID)
			changed = true
		}
		if p.unprepared == nil {
			p.unprepared = map[types.UID]bool{}
		}
		p.unprepared[c.UID] = true
		delete(p.api, c.UID)
		out[c.UID] = nil
	}
	if changed {
		if err := p.commit(next); err != nil {
			return nil, err
		}
		// A namespace's last MPS claim on a GPU takes its daemon with it.
		p.syncMPSTenants(ctx)
	}
	return out, nil
}

// HandleError logs errors of kubeletplugin.Helper's background work (kubeletplugin.DRAPlugin). The plugin
// publishes no slices through kubeletplugin.Helper (Publisher does), so none of them is fatal here.
func (p *KubeletPlugin) HandleError(ctx context.Context, err error, msg string) {
	p.log.Error(err, msg)
}

// podPriorityTimeout bounds the read of one pod's priority while a claim is prepared.
const podPriorityTimeout = 5 * time.Second

// production says whether every pod claim c is reserved for is production under q (a claim of no pod, or
// a pod that cannot be read, is not: production is never given by default).
func (p *KubeletPlugin) production(ctx context.Context, c *resourcev1.ResourceClaim, q *v1alpha1.QoS) bool {
	pods := reservedPods(c)
	if p.PodPriority == nil || len(pods) == 0 {
		return false
	}
	for _, name := range pods {
		pctx, cancel := context.WithTimeout(ctx, podPriorityTimeout)
		prio, ok := p.PodPriority(pctx, c.Namespace, name)
		cancel()
		if !ok || !q.Production(prio) {
			return false
		}
	}
	return true
}
