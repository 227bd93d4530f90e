package accounting

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/internal/promreg"
)

// DefaultMaxSeriesPerGPU bounds the containers a GPU exports series for. A GPU shared by more (MPS
// allows 48 clients, time-slicing any number) exports the ones using the most memory and counts the
// rest in gpusharing_pod_series_omitted, so a crowded node cannot flood Prometheus.
const DefaultMaxSeriesPerGPU = 48

var podLabels = []string{"namespace", "pod", "container", "gpu", "node"}

// Metrics exports each node's latest snapshot as per-pod series. The series are made at scrape time
// from the snapshot, so a pod's series leave with the pod at the next sample and never outlive it.
// Several agents in one process (the demo's simulated nodes) share the one registered first.
type Metrics struct {
	// MaxSeriesPerGPU bounds the containers exported per GPU (DefaultMaxSeriesPerGPU).
	MaxSeriesPerGPU int

	memory, sm, swapped, lockWait, lockHold, omitted, podGPUs *prometheus.Desc

	nodes promreg.Nodes[*Accountant]
}

// NewMetrics registers the per-pod series on reg (nil: unregistered, for tests), or returns the
// Metrics an agent of the same process registered already.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		memory: prometheus.NewDesc("gpusharing_pod_gpu_memory_used_bytes",
			"Device memory the container's processes hold on the GPU, as NVML lists them per process (MPS clients and MIG instances included).", podLabels, nil),
		sm: prometheus.NewDesc("gpusharing_pod_gpu_sm_utilization_percent",
			"Percent of time the container's processes had a kernel on the GPU's SMs, averaged over NVML's per-process samples since the previous read (absent where the GPU takes none: MIG).", podLabels, nil),
		swapped: prometheus.NewDesc("gpusharing_pod_shim_swapped_bytes",
			"Memory of the container's shim clients copied out to host staging, as they last reported.", podLabels, nil),
		lockWait: prometheus.NewDesc("gpusharing_pod_shim_lock_wait_seconds_total",
			"Time the container's shim clients waited for the GPU lock (resets when a client process exits).", podLabels, nil),
		lockHold: prometheus.NewDesc("gpusharing_pod_shim_lock_hold_seconds_total",
			"Time the container's shim clients held the GPU lock (resets when a client process exits).", podLabels, nil),
		omitted: prometheus.NewDesc("gpusharing_pod_series_omitted",
			"Containers using the GPU that export no per-pod series because the GPU has more than the cap.", []string{"gpu", "node"}, nil),
		podGPUs: prometheus.NewDesc("gpusharing_pod_gpus",
			"GPUs the pod's processes use on the node (exported for pods with a container among the per-GPU series).", []string{"namespace", "pod", "node"}, nil),
	}
	return promreg.Register(reg, m)
}

// Add exports the node's accountant; a nil *Metrics exports nothing.
func (m *Metrics) Add(node string, a *Accountant) {
	if m == nil {
		return
	}
	m.nodes.Add(node, a)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.memory, m.sm, m.swapped, m.lockWait, m.lockHold, m.omitted, m.podGPUs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	limit := m.MaxSeriesPerGPU
	if limit <= 0 {
		limit = DefaultMaxSeriesPerGPU
	}
	for node, a := range m.nodes.Snapshot() {
		snap := a.Latest()
		exported := map[[2]string]bool{}
		for _, g := range snap.GPUs {
			for _, c := range m.collectGPU(ch, node, g, limit) {
				exported[[2]string{c.Namespace, c.Name}] = true
			}
		}
		// A pod's GPU count goes with its containers' series: bounded by the same cap, gone with the pod.
		for _, p := range snap.Pods() {
			if exported[[2]string{p.Namespace, p.Name}] {
				ch <- prometheus.MustNewConstMetric(m.podGPUs, prometheus.GaugeValue, float64(len(p.GPUs)), p.Namespace, p.Name, node)
			}
		}
	}
}

// collectGPU exports the GPU's containers up to limit and returns those it exported.
func (m *Metrics) collectGPU(ch chan<- prometheus.Metric, node string, g GPU, limit int) []Container {
	cs := Top(g.Containers, limit)
	if n := len(g.Containers) - len(cs); n > 0 {
		ch <- prometheus.MustNewConstMetric(m.omitted, prometheus.GaugeValue, float64(n), g.UUID, node)
	}
	for _, c := range cs {
		lv := []string{c.Namespace, c.Name, c.Container, g.UUID, node}
		ch <- prometheus.MustNewConstMetric(m.memory, prometheus.GaugeValue, float64(c.MemoryBytes), lv...)
		if c.SMKnown {
			ch <- prometheus.MustNewConstMetric(m.sm, prometheus.GaugeValue, c.SMPercent, lv...)
		}
		if c.Shim != nil {
			ch <- prometheus.MustNewConstMetric(m.swapped, prometheus.GaugeValue, float64(c.Shim.SwappedBytes), lv...)
			ch <- prometheus.MustNewConstMetric(m.lockWait, prometheus.CounterValue, c.Shim.LockWait.Seconds(), lv...)
			ch <- prometheus.MustNewConstMetric(m.lockHold, prometheus.CounterValue, c.Shim.LockHold.Seconds(), lv...)
		}
	}
	return cs
}
