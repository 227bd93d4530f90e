package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/accounting"
)

// Each prepared claim of a sized device shows what its pods hold and use in its own status
// (status.devices[].data, DRA's device status), so its owner reads it beside the size asked with
// kubectl get resourceclaim, without node access. A write per claim per sample would cost the API server
// a write every few seconds per claim; so a claim's status is written when its figures move past the
// thresholds (the GPUNode status's: 256 MiB or 5 % of memory, 10 points of SM use; a new pod or a new
// peak past them), at most once per MinDeviceStatusGap, and smaller moves at most once per Interval.
const (
	// DefaultDeviceStatusInterval is how often a claim whose figures moved less than the thresholds is
	// written (--claim-status-interval).
	DefaultDeviceStatusInterval = 5 * time.Minute
	// MinDeviceStatusGap is the least time between two writes of one claim's device status.
	MinDeviceStatusGap = 15 * time.Second
	// DeviceStatusFieldManager owns status.devices entries of this driver (server-side apply).
	DeviceStatusFieldManager = "gpusharing-agent"

	deviceMemoryStep     = 256 << 20
	deviceMemoryFraction = 20
	deviceSMStep         = 10
	deviceStatusTimeout  = 10 * time.Second
)

// DeviceUsage is status.devices[].data of a sized device: what the claim's pods hold and use of the
// device's GPU now and at their peak since the agent first read them.
type DeviceUsage struct {
	// Pods are the pods of the claim, in its namespace, the figures are of.
	Pods []string `json:"pods,omitempty"`
	// MemoryBytes is the device memory their processes hold (NVML's count, contexts included);
	// PeakMemoryBytes the most they held together at one read.
	MemoryBytes     int64 `json:"memoryBytes"`
	PeakMemoryBytes int64 `json:"peakMemoryBytes"`
	// SMPercent is the percent of time their processes had kernels on the SMs at the last read;
	// PeakSMPercent the most at one read. Absent where the GPU takes no per-process samples.
	SMPercent     *int32 `json:"smPercent,omitempty"`
	PeakSMPercent *int32 `json:"peakSMPercent,omitempty"`
	// SampledAt is when the figures were read; PeakAt when the memory peak was.
	SampledAt metav1.Time `json:"sampledAt"`
	PeakAt    metav1.Time `json:"peakAt"`
}

// sizedDevice is one sized device of a claim the plugin prepared, as its status names it.
type sizedDevice struct {
	pool, device string
	shareID      *types.UID
	gpu          string
}

// preparedSized is a claim the plugin prepared with sized devices, and the pods it serves.
type preparedSized struct {
	uid             types.UID
	namespace, name string
	pods            []string
	devices         []sizedDevice
}

// preparedSizedClaims lists the claims this plugin prepared (its checkpoint) that hold sized devices,
// with the pods of the checkpoint and of the last read of the API server.
func (p *KubeletPlugin) preparedSizedClaims() []preparedSized {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []preparedSized
	for uid, pc := range p.cp.Claims {
		c := preparedSized{uid: uid, namespace: pc.Namespace, name: pc.Name}
		for _, d := range pc.Devices {
			index, sized := SizedIndex(d.Device)
			if !sized {
				continue
			}
			gpu := d.GPU
			if gpu == "" {
				gpu = p.gpus[index]
			}
			if gpu != "" {
				c.devices = append(c.devices, sizedDevice{pool: d.Pool, device: d.Device, shareID: d.ShareID, gpu: gpu})
			}
		}
		if len(c.devices) == 0 {
			continue
		}
		c.pods = slices.Concat(pc.Pods, p.api[uid].pods)
		slices.Sort(c.pods)
		c.pods = slices.Compact(c.pods)
		out = append(out, c)
	}
	return out
}

// DeviceStatusWriter writes the use of each sized device of the claims the plugin prepared into the
// claims' status.devices (DeviceUsage), from the accounting's snapshots.
type DeviceStatusWriter struct {
	Plugin *KubeletPlugin
	Kube   kubernetes.Interface
	// Interval is how often a claim whose figures moved less than the thresholds is written
	// (DefaultDeviceStatusInterval when zero).
	Interval time.Duration
	// Clock is the time source; nil is the real clock.
	Clock clock.PassiveClock
	Log   logr.Logger

	snaps chan accounting.Snapshot
	mu    sync.Mutex
	// last is what was last written per claim and device, and what was read since.
	last map[types.UID]*claimWrite
}

type claimWrite struct {
	written   map[string]DeviceUsage // by device key, as written
	current   map[string]DeviceUsage // by device key, as last read (peaks included)
	writtenAt time.Time
	// failedAt is when the last write failed (zero: it did not); the next waits MinDeviceStatusGap.
	failedAt time.Time
}

func (w *DeviceStatusWriter) now() time.Time {
	if w.Clock == nil {
		return time.Now()
	}
	return w.Clock.Now()
}

func (w *DeviceStatusWriter) interval() time.Duration {
	if w.Interval > 0 {
		return w.Interval
	}
	return DefaultDeviceStatusInterval
}

// Sampled hands a snapshot to Run; it never blocks (a snapshot Run has not taken yet is replaced).
func (w *DeviceStatusWriter) Sampled(s accounting.Snapshot) {
	w.init()
	select {
	case w.snaps <- s:
		return
	default:
	}
	select {
	case <-w.snaps:
	default:
	}
	select {
	case w.snaps <- s:
	default:
	}
}

func (w *DeviceStatusWriter) init() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.snaps == nil {
		w.snaps = make(chan accounting.Snapshot, 1)
		w.last = map[types.UID]*claimWrite{}
	}
}

// Run writes the claims' device status from each snapshot until ctx ends.
func (w *DeviceStatusWriter) Run(ctx context.Context) error {
	w.init()
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-w.snaps:
			w.Write(ctx, s)
		}
	}
}

// Write folds one snapshot into each prepared sized claim's figures and writes the claims due.
func (w *DeviceStatusWriter) Write(ctx context.Context, s accounting.Snapshot) {
	w.init()
	now := w.now()
	claims := w.Plugin.preparedSizedClaims()
	keep := map[types.UID]bool{}
	for _, c := range claims {
		keep[c.uid] = true
		w.mu.Lock()
		cw := w.last[c.uid]
		if cw == nil {
			cw = &claimWrite{current: map[string]DeviceUsage{}}
			w.last[c.uid] = cw
		}
		read := false
		for _, d := range c.devices {
			g, ok := s.GPU(d.gpu)
			if !ok || g.Err != nil || !g.ProcessesRead {
				continue
			}
			read = true
			key := deviceKey(d)
			cw.current[key] = foldUsage(cw.current[key], c.namespace, c.pods, g, s.At)
		}
		due := read && w.due(cw, now)
		var devices map[string]DeviceUsage
		if due {
			devices = maps.Clone(cw.current)
		}
		w.mu.Unlock()
		if !due {
			continue
		}
		switch err := w.apply(ctx, c, devices); {
		case err == nil:
			w.mu.Lock()
			cw.written, cw.writtenAt, cw.failedAt = devices, now, time.Time{}
			w.mu.Unlock()
		case apierrors.IsNotFound(err):
			keep[c.uid] = false
		default:
			// Tried again after the least gap: what was written stays the reference.
			w.mu.Lock()
			cw.failedAt = now
			w.mu.Unlock()
			w.Log.Error(err, "Cannot write the use of a ResourceClaim's devices", "claim", c.namespace+"/"+c.name)
		}
	}
	w.mu.Lock()
	for uid := range w.last {
		if !keep[uid] {
			delete(w.last, uid)
		}
	}
	w.mu.Unlock()
}

// due says whether cw's figures are to be written now: never within MinDeviceStatusGap of the last
// write or failed write; at once when a figure moved past its threshold (or a device or pod came or went); after the
// interval when any figure moved at all.
func (w *DeviceStatusWriter) due(cw *claimWrite, now time.Time) bool {
	if !cw.failedAt.IsZero() && now.Sub(cw.failedAt) < MinDeviceStatusGap {
		return false
	}
	if cw.written == nil {
		return true
	}
	if now.Sub(cw.writtenAt) < MinDeviceStatusGap {
		return false
	}
	if len(cw.written) != len(cw.current) {
		return true
	}
	moved := false
	for k, cur := range cw.current {
		old, ok := cw.written[k]
		if !ok || !slices.Equal(old.Pods, cur.Pods) || pastMemory(old.MemoryBytes, cur.MemoryBytes) ||
			pastMemory(old.PeakMemoryBytes, cur.PeakMemoryBytes) || pastSM(old.SMPercent, cur.SMPercent) || pastSM(old.PeakSMPercent, cur.PeakSMPercent) {
			return true
		}
		moved = moved || old.MemoryBytes != cur.MemoryBytes || old.PeakMemoryBytes != cur.PeakMemoryBytes ||
			!eqInt32(old.SMPercent, cur.SMPercent) || !eqInt32(old.PeakSMPercent, cur.PeakSMPercent)
	}
	return moved && now.Sub(cw.writtenAt) >= w.interval()
}

// apply writes the claim's sized devices' usage with server-side apply: the entries of this driver
// only, so a status another driver writes for its devices of the claim stays.
func (w *DeviceStatusWriter) apply(ctx context.Context, c preparedSized, usage map[string]DeviceUsage) error {
	st := resourceapply.ResourceClaimStatus()
	for _, d := range c.devices {
		u, ok := usage[deviceKey(d)]
		if !ok {
			continue
		}
		data, err := json.Marshal(u)
		if err != nil {
			return err
		}
		ds := resourceapply.AllocatedDeviceStatus().WithDriver(DriverName).WithPool(d.pool).WithDevice(d.device).
			WithData(runtime.RawExtension{Raw: data})
		if d.shareID != nil {
			ds.WithShareID(string(*d.shareID))
		}
		st.WithDevices(ds)
	}
	ac := resourceapply.ResourceClaim(c.name, c.namespace).WithUID(c.uid).WithStatus(st)
	ctx, cancel := context.WithTimeout(ctx, deviceStatusTimeout)
	defer cancel()
	_, err := w.Kube.ResourceV1().ResourceClaims(c.namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: DeviceStatusFieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("writing the device status of ResourceClaim %s/%s: %w", c.namespace, c.name, err)
	}
	return nil
}

func deviceKey(d sizedDevice) string {
	if d.shareID != nil {
		return d.pool + "/" + d.device + "/" + string(*d.shareID)
	}
	return d.pool + "/" + d.device
}

// foldUsage is prev with the read g of the pods' containers: the figures now, the peaks kept.
func foldUsage(prev DeviceUsage, namespace string, pods []string, g accounting.GPU, at time.Time) DeviceUsage {
	u := DeviceUsage{Pods: slices.Clone(pods), PeakMemoryBytes: prev.PeakMemoryBytes, PeakSMPercent: prev.PeakSMPercent,
		SampledAt: metav1.NewTime(at.Truncate(time.Second)), PeakAt: prev.PeakAt}
	var sm float64
	for _, c := range g.Containers {
		if c.Namespace != namespace || !slices.Contains(pods, c.Name) {
			continue
		}
		u.MemoryBytes += int64(c.MemoryBytes)
		if c.SMKnown {
			sm += c.SMPercent
		}
	}
	if u.MemoryBytes > u.PeakMemoryBytes || u.PeakAt.IsZero() {
		u.PeakMemoryBytes, u.PeakAt = max(u.MemoryBytes, u.PeakMemoryBytes), u.SampledAt
	}
	// Where the GPU takes per-process samples, pods with no process on it use none of its SMs.
	if g.UtilizationRead {
		v := int32(min(sm, 100) + 0.5)
		u.SMPercent = &v
		if u.PeakSMPercent == nil || v > *u.PeakSMPercent {
			u.PeakSMPercent = &v
		}
	}
	return u
}

func pastMemory(old, cur int64) bool {
	step := max(int64(deviceMemoryStep), old/deviceMemoryFraction)
	return max(old, cur)-min(old, cur) >= step
}

func pastSM(old, cur *int32) bool {
	if old == nil || cur == nil {
		return (old == nil) != (cur == nil)
	}
	return max(*old, *cur)-min(*old, *cur) >= deviceSMStep
}

func eqInt32(a, b *int32) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}
