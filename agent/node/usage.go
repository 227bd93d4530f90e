package node

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Thresholds below which the status keeps the figure it published: the accounting reads every few
// seconds and memory and utilization move all the time, while every status write is an etcd write
// and a watch event for every reader of the GPUNode. A pod that comes or goes is always published.
const (
	// usageMemoryStep is the least memory change published: allocators grow in 2 MiB-20 MiB steps and
	// CUDA contexts drift, which no reader of the status needs to see.
	usageMemoryStep = 256 << 20
	// usageMemoryFraction is the least relative change published for large figures (5%).
	usageMemoryFraction = 20
	// usageSMStep is the least change of SM utilization published, in percentage points.
	usageSMStep = 10
)

// UsageSource is the accounting's latest snapshot (*accounting.Accountant).
type UsageSource interface {
	Latest() accounting.Snapshot
}

// usageState is what the last pass published of each GPU's usage, to tell whether a new sample is
// worth a pass; samples arrive on the accounting's goroutine.
type usageState struct {
	mu        sync.Mutex
	published map[string]publishedUsage
	pods      publishedPods
}

// publishedUsage is one GPU's usage as the last pass published it, with the production classes it
// was classed by.
type publishedUsage struct {
	usage *v1alpha1.GPUUsage
	qos   *v1alpha1.QoS
}

func (u *usageState) set(gpus []v1alpha1.GPUStatus) {
	m := make(map[string]publishedUsage, len(gpus))
	for i := range gpus {
		m[gpus[i].UUID] = publishedUsage{usage: gpus[i].Usage, qos: appliedQoS(&gpus[i])}
	}
	u.mu.Lock()
	u.published = m
	u.mu.Unlock()
}

// UsageSampled wakes a pass when the snapshot changes what the status shows; samples that stay within
// the thresholds cost nothing.
func (r *Reconciler) UsageSampled(snap accounting.Snapshot) {
	if snap.Err != nil || r.Notify == nil {
		return
	}
	r.usage.mu.Lock()
	published, pods := r.usage.published, r.usage.pods
	r.usage.mu.Unlock()
	if published == nil {
		return // no pass has published yet; the first one reads the snapshot
	}
	// Every sample is shown to the unmanaged check, which times its grace by the reads.
	unmanaged := r.Unmanaged != nil && r.Unmanaged.Tracker.Changed(snap)
	if unmanaged || r.overClaimsChanged(snap) || pods.changed(snap) {
		r.Notify()
		return
	}
	for _, g := range snap.GPUs {
		if g.Err != nil {
			continue
		}
		prev, ok := published[g.UUID]
		if !ok {
			continue // a GPU the status does not list yet: the pass that lists it reads the snapshot
		}
		if !equality.Semantic.DeepEqual(usageStatus(g, prev.usage, prev.qos), prev.usage) {
			r.Notify()
			return
		}
	}
}

// gpuUsage is the GPU's usage for the status: from the latest snapshot, or what was published where
// the accounting has not read the GPU (yet, or this time).
func (r *Reconciler) gpuUsage(uuid string, prev *v1alpha1.GPUStatus, qos *v1alpha1.QoS) *v1alpha1.GPUUsage {
	var old *v1alpha1.GPUUsage
	if prev != nil {
		old = prev.Usage
	}
	if r.Usage == nil {
		return nil
	}
	g, ok := r.Usage.Latest().GPU(uuid)
	if !ok || g.Err != nil {
		return old
	}
	return usageStatus(g, old, qos)
}

// appliedQoS is the production classes in force on the GPU of st, nil where it has none.
func appliedQoS(st *v1alpha1.GPUStatus) *v1alpha1.QoS {
	if st.Applied == nil {
		return nil
	}
	return st.Applied.QoS
}

// usageStatus builds status.gpus[].usage from one GPU's account, keeping each figure of prev that moved
// less than its threshold, so that the status changes only when a reader would care. Under production
// classes (qos) each consumer is classed by its pod's priority.
func usageStatus(g accounting.GPU, prev *v1alpha1.GPUUsage, qos *v1alpha1.QoS) *v1alpha1.GPUUsage {
	out := &v1alpha1.GPUUsage{Processes: int32(len(g.Processes))}
	used := g.MemoryUsed
	if g.ProcessesRead {
		used = 0
		for _, p := range g.Processes {
			used += p.MemoryBytes
		}
	}
	var prevUsed *resource.Quantity
	prevByKey := map[string]v1alpha1.GPUConsumer{}
	if prev != nil {
		prevUsed = prev.MemoryUsed
		for _, c := range prev.Consumers {
			prevByKey[c.Namespace+"/"+c.Pod+"/"+c.Container] = c
		}
	}
	out.MemoryUsed = steadyMemory(used, prevUsed)
	top := accounting.Top(g.Containers, v1alpha1.MaxConsumersInStatus)
	out.OmittedConsumers = int32(len(g.Containers) - len(top))
	for _, c := range top {
		old := prevByKey[c.Namespace+"/"+c.Name+"/"+c.Container]
		gc := v1alpha1.GPUConsumer{Namespace: c.Namespace, Pod: c.Name, Container: c.Container, Processes: int32(len(c.PIDs)),
			Class: v1alpha1.ClassOf(qos, c.Priority)}
		if c.MemoryComplete {
			gc.Memory = steadyMemory(c.MemoryBytes, old.Memory)
		}
		if c.SMKnown {
			gc.SMUtilization = steadySM(c.SMPercent, old.SMUtilization)
		}
		out.Consumers = append(out.Consumers, gc)
	}
	// Memory first, as Top chose them, but by the published figures, so an order flip within the
	// thresholds writes nothing; then by name.
	sort.SliceStable(out.Consumers, func(i, j int) bool {
		a, b := out.Consumers[i], out.Consumers[j]
		am, bm := quantityValue(a.Memory), quantityValue(b.Memory)
		if am != bm {
			return am > bm
		}
		return a.Namespace+"/"+a.Pod+"/"+a.Container < b.Namespace+"/"+b.Pod+"/"+b.Container
	})
	return out
}

// steadyMemory is prev where used moved less than the threshold from it, else used rounded to MiB.
func steadyMemory(used uint64, prev *resource.Quantity) *resource.Quantity {
	if prev != nil {
		p := uint64(max(prev.Value(), 0))
		step := max(uint64(usageMemoryStep), p/usageMemoryFraction)
		if max(used, p)-min(used, p) < step {
			return prev
		}
	}
	return resource.NewQuantity(int64(used>>20)<<20, resource.BinarySI)
}

func steadySM(pct float64, prev *int32) *int32 {
	v := int32(pct + 0.5)
	if prev != nil && max(v, *prev)-min(v, *prev) < usageSMStep {
		return prev
	}
	return &v
}

func quantityValue(q *resource.Quantity) int64 {
	if q == nil {
		return -1
	}
	return q.Value()
}

// memoryUsedSummary renders each GPU's used memory for the wide table: "0:12.5Gi/80Gi 1:0/80Gi".
func memoryUsedSummary(gpus []v1alpha1.GPUStatus) string {
	return perGPUSummary(gpus, func(g *v1alpha1.GPUStatus) (string, bool) {
		if g.Usage == nil || g.Usage.MemoryUsed == nil {
			return "", false
		}
		total := "?"
		if g.Memory != nil {
			total = humanGi(g.Memory.Value())
		}
		return humanGi(g.Usage.MemoryUsed.Value()) + "/" + total, true
	})
}

// humanGi renders bytes in Gi with one decimal, or "0".
func humanGi(b int64) string {
	if b <= 0 {
		return "0"
	}
	s := fmt.Sprintf("%.1f", float64(b)/(1<<30))
	return strings.TrimSuffix(s, ".0") + "Gi"
}

// ShimClients lets the accounting read the GPU's shim clients: their lock wait and hold time and their
// swapped memory, as the scheduler keeps them.
func (s *ShimSchedulers) ShimClients(uuid string) []accounting.ShimClient {
	st, ok := s.State(uuid)
	if !ok {
		return nil
	}
	out := make([]accounting.ShimClient, 0, len(st.Clients))
	for _, c := range st.Clients {
		out = append(out, accounting.ShimClient{PID: c.PID, LockWait: c.WaitTime, LockHold: c.HoldTime, SwappedBytes: c.SwappedBytes, ResidentBytes: c.ResidentBytes})
	}
	return out
}
