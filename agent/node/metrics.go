package node

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/promreg"
)

// Metrics mirror the published status, so a fleet dashboard needs no API server queries. Series carry
// the node, so several agents in one process (the demo's simulated nodes) keep theirs apart, and a
// GPU's series go when the GPU leaves the node's status. Metrics is one Prometheus collector: the
// agents of a process share the one registered first (NewMetrics).
type Metrics struct {
	gpus        *prometheus.GaugeVec
	appliedGPUs *prometheus.GaugeVec
	gpuApplied  *prometheus.GaugeVec
	mpsRestarts *prometheus.GaugeVec
	// sharingInfo and drainDuration: sharingmetrics.go.
	sharingInfo   *prometheus.GaugeVec
	drainDuration *prometheus.HistogramVec

	mu sync.Mutex
	// sharingLast holds each node's GPUs' current sharing-info labels, so a change replaces the series.
	sharingLast map[string]map[string][]string
	// seen holds, per node, the GPUs whose series were set, to delete those of GPUs that left.
	seen map[string]map[string]bool
}

// NewMetrics registers the agent's series on reg (nil: unregistered, for tests). When an agent of the
// same process registered them already, it returns that one.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		gpus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_agent_gpus", Help: "GPUs NVML reports on this node.",
		}, []string{"node"}),
		appliedGPUs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_agent_applied_gpus", Help: "Listed GPUs that run their desired sharing.",
		}, []string{"node"}),
		gpuApplied: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_agent_gpu_applied", Help: "1 when the GPU's Applied condition is True, else 0.",
		}, []string{"node", "gpu"}),
		mpsRestarts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_agent_mps_daemon_restarts", Help: "How often the agent restarted the GPU's MPS daemon.",
		}, []string{"node", "gpu"}),
		sharingInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_agent_gpu_sharing_info",
			Help: "1 per GPU, labelled with its index, the declared sharing (the GPUNode's spec; none when no policy lists the GPU) and the sharing in force (its status).",
		}, []string{"node", "gpu", "index", "declared", "applied"}),
		drainDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpusharing_agent_drain_duration_seconds",
			Help: "Time from cordoning a GPU to the end of its drain before a disruptive change, by outcome (drained, timed_out, failed).",
			// Drains wait for pods to end: seconds for an idle GPU, up to the timeout (10m by default) and beyond.
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600},
		}, []string{"node", "gpu", "outcome"}),
		seen:        map[string]map[string]bool{},
		sharingLast: map[string]map[string][]string{},
	}
	return promreg.Register(reg, m)
}

func (m *Metrics) vecs() []*prometheus.GaugeVec {
	return []*prometheus.GaugeVec{m.gpus, m.appliedGPUs, m.gpuApplied, m.mpsRestarts}
}

func (m *Metrics) collectors() []prometheus.Collector {
	out := []prometheus.Collector{m.sharingInfo, m.drainDuration}
	for _, v := range m.vecs() {
		out = append(out, v)
	}
	return out
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// record sets the node's series from the status a pass computed and deletes those of GPUs no longer
// in it (and the MPS restarts of a GPU that left MPS). A nil *Metrics records nothing.
func (m *Metrics) record(node string, st v1alpha1.GPUNodeStatus) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpus.WithLabelValues(node).Set(float64(st.GPUCount))
	m.appliedGPUs.WithLabelValues(node).Set(float64(st.AppliedGPUs))
	now := map[string]bool{}
	for _, g := range st.GPUs {
		now[g.UUID] = true
		v := 0.0
		if meta.IsStatusConditionPresentAndEqual(g.Conditions, v1alpha1.ConditionApplied, metav1.ConditionTrue) {
			v = 1
		}
		m.gpuApplied.WithLabelValues(node, g.UUID).Set(v)
		// Every outcome's histogram exists from the GPU's first pass, at zero: increase() reads nothing in
		// a series born at its first observation, so without it the GPU's first timed-out drain would
		// never fire GPUSharingDrainTimedOut, and the drain panels would have no series until a drain.
		for _, o := range drainOutcomes {
			m.drainDuration.WithLabelValues(node, g.UUID, o)
		}
		if g.Applied != nil && g.Applied.MPS != nil {
			m.mpsRestarts.WithLabelValues(node, g.UUID).Set(float64(g.Applied.MPS.Restarts))
		} else {
			m.mpsRestarts.DeleteLabelValues(node, g.UUID)
		}
	}
	for uuid := range m.seen[node] {
		if !now[uuid] {
			m.gpuApplied.DeleteLabelValues(node, uuid)
			m.mpsRestarts.DeleteLabelValues(node, uuid)
			if old, ok := m.sharingLast[node][uuid]; ok {
				m.sharingInfo.DeleteLabelValues(old...)
				delete(m.sharingLast[node], uuid)
			}
			m.drainDuration.DeletePartialMatch(prometheus.Labels{"node": node, "gpu": uuid})
		}
	}
	m.seen[node] = now
}
