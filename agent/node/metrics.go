package node

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
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

	mu sync.Mutex
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
		seen: map[string]map[string]bool{},
	}
	if reg == nil {
		return m, nil
	}
	if err := reg.Register(m); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*Metrics); ok {
				return existing, nil
			}
		}
		return nil, err
	}
	return m, nil
}

func (m *Metrics) vecs() []*prometheus.GaugeVec {
	return []*prometheus.GaugeVec{m.gpus, m.appliedGPUs, m.gpuApplied, m.mpsRestarts}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range m.vecs() {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, v := range m.vecs() {
		v.Collect(ch)
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
		}
	}
	m.seen[node] = now
}
