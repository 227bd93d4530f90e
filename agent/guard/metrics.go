package guard

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/internal/promreg"
)

// Metrics is gpusharing_unmanaged_processes{node, gpu, namespace, pod}: the processes of each pod that the
// check names on each GPU, every one of them (the status lists at most eight). A pod's series goes when it
// has none left on the GPU. One collector per process: the agents of a process share the first registered.
type Metrics struct {
	procs *prometheus.GaugeVec

	mu sync.Mutex
	// last holds, per node, the label values set at the last record, to delete those that went.
	last map[string]map[[3]string]bool
}

// NewMetrics registers the series on reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		procs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_unmanaged_processes",
			Help: "Processes of a pod that hold a context on a checked GPU without being managed there (not a client of its shim scheduler or MPS server), past the grace.",
		}, []string{"node", "gpu", "namespace", "pod"}),
		last: map[string]map[[3]string]bool{},
	}
	return promreg.Register(reg, m)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.procs.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.procs.Collect(ch) }

// Record sets the node's series from one pass's verdicts (by GPU uuid) and deletes those that went. A GPU
// not read keeps its series. A nil *Metrics records nothing.
func (m *Metrics) Record(node string, verdicts map[string]Verdict) {
	if m == nil {
		return
	}
	counts := map[[3]string]int{}
	for uuid, v := range verdicts {
		for _, p := range v.Named {
			counts[[3]string{uuid, p.Namespace, p.Name}]++
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := map[[3]string]bool{}
	for k, n := range counts {
		now[k] = true
		m.procs.WithLabelValues(node, k[0], k[1], k[2]).Set(float64(n))
	}
	for k := range m.last[node] {
		if now[k] {
			continue
		}
		if v, ok := verdicts[k[0]]; ok && !v.Read {
			now[k] = true // unread: kept as last set
			continue
		}
		m.procs.DeleteLabelValues(node, k[0], k[1], k[2])
	}
	m.last[node] = now
}
