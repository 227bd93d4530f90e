package dra

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/internal/promreg"
)

// Reasons of gpusharing_agent_resourceslice_errors_total.
const (
	// errorFailed: a sync of the node's slices failed (the API server refused or did not answer a read or
	// write); the controller retries with backoff.
	errorFailed = "failed"
	// errorDroppedFields: the API server stored a slice without fields of a feature gate that is off.
	errorDroppedFields = "dropped_fields"
)

// SliceMetrics export how publishing the node's ResourceSlices goes. Several agents in one process share
// the one registered first; every series of a node exists from its publisher's start, at zero, so
// increase() sees the first error.
type SliceMetrics struct {
	errors    *prometheus.CounterVec
	published *prometheus.GaugeVec
}

// NewSliceMetrics registers the series on reg (nil: unregistered, for tests), or returns the
// SliceMetrics an agent of the same process registered already.
func NewSliceMetrics(reg prometheus.Registerer) (*SliceMetrics, error) {
	m := &SliceMetrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpusharing_agent_resourceslice_errors_total",
			Help: "Errors publishing the node's DRA ResourceSlices, by reason: failed (a sync the controller retries) or dropped_fields (the API server stored a slice without fields of a feature gate that is off).",
		}, []string{"node", "reason"}),
		published: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpusharing_agent_resourceslices_published",
			Help: "1 when the last sync of the node's DRA ResourceSlices succeeded, 0 before the first and while syncs fail.",
		}, []string{"node"}),
	}
	return promreg.Register(reg, m)
}

// Describe implements prometheus.Collector.
func (m *SliceMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.errors.Describe(ch)
	m.published.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *SliceMetrics) Collect(ch chan<- prometheus.Metric) {
	m.errors.Collect(ch)
	m.published.Collect(ch)
}

// init makes the node's series, at zero; a nil *SliceMetrics exports nothing.
func (m *SliceMetrics) init(node string) {
	if m == nil {
		return
	}
	for _, r := range []string{errorFailed, errorDroppedFields} {
		m.errors.WithLabelValues(node, r)
	}
	m.published.WithLabelValues(node).Set(0)
}

func (m *SliceMetrics) countError(node, reason string) {
	if m == nil {
		return
	}
	m.errors.WithLabelValues(node, reason).Inc()
}

func (m *SliceMetrics) setPublished(node string, ok bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ok {
		v = 1
	}
	m.published.WithLabelValues(node).Set(v)
}
