package dra

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/internal/promreg"
)

// DefaultMaxClaimSeriesPerGPU bounds the claim series one sized GPU exports: the policy's memory step
// and minimum bound the claims a GPU holds only loosely (a 1 MiB step allows thousands), so the
// largest claims are exported and the rest counted in gpusharing_pod_claim_series_omitted.
const DefaultMaxClaimSeriesPerGPU = 48

// The claim series carry no container label: the kubelet prepares a claim for a pod, and the plugin is
// not told which of the pod's containers use it. Compare them with the per-pod series summed over the
// pod's containers.
var claimLabels = []string{"namespace", "pod", "claim", "gpu", "node"}

// SizedClaimLister lists the sized claims prepared on a node; *KubeletPlugin is one.
type SizedClaimLister interface {
	SizedClaims() []SizedClaim
}

// ClaimMetrics exports, per pod a prepared sized claim is reserved for, the memory and compute the claim
// holds of the GPU. The series are made at scrape time from the plugin's checkpoint, so they leave with
// the claim when the kubelet unprepares it. Several agents in one process share the one registered first.
type ClaimMetrics struct {
	// MaxSeriesPerGPU bounds the series exported per GPU (DefaultMaxClaimSeriesPerGPU).
	MaxSeriesPerGPU int

	memory, compute, omitted *prometheus.Desc

	nodes promreg.Nodes[SizedClaimLister]
}

// NewClaimMetrics registers the claim series on reg (nil: unregistered, for tests), or returns the
// ClaimMetrics an agent of the same process registered already.
func NewClaimMetrics(reg prometheus.Registerer) (*ClaimMetrics, error) {
	m := &ClaimMetrics{
		memory: prometheus.NewDesc("gpusharing_pod_claim_memory_bytes",
			"Device memory of a sized GPU the pod's ResourceClaim was allocated (its consumedCapacity): the pod's limit on the GPU.", claimLabels, nil),
		compute: prometheus.NewDesc("gpusharing_pod_claim_compute_percent",
			"Percent of a sized GPU's SMs the pod's ResourceClaim was allocated (a limit on MPS GPUs only).", claimLabels, nil),
		omitted: prometheus.NewDesc("gpusharing_pod_claim_series_omitted",
			"Pods of sized claims that export no claim series because the GPU has more than the cap.", []string{"gpu", "node"}, nil),
	}
	return promreg.Register(reg, m)
}

// Add exports the node's claims; a nil *ClaimMetrics exports nothing.
func (m *ClaimMetrics) Add(node string, l SizedClaimLister) {
	if m == nil {
		return
	}
	m.nodes.Add(node, l)
}

// Describe implements prometheus.Collector.
func (m *ClaimMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.memory, m.compute, m.omitted} {
		ch <- d
	}
}

// claimSeries is one (claim, pod) pair of a GPU.
type claimSeries struct {
	claim SizedClaim
	pod   string
}

// Collect implements prometheus.Collector.
func (m *ClaimMetrics) Collect(ch chan<- prometheus.Metric) {
	limit := m.MaxSeriesPerGPU
	if limit <= 0 {
		limit = DefaultMaxClaimSeriesPerGPU
	}
	for node, l := range m.nodes.Snapshot() {
		byGPU := map[string][]claimSeries{}
		// A claim deleted and made again under its name may be prepared before the old one is
		// unprepared: one series per label set, or the whole scrape fails.
		seen := map[[4]string]bool{}
		for _, c := range l.SizedClaims() {
			for _, pod := range c.Pods {
				key := [4]string{c.Namespace, pod, c.Name, c.GPU}
				if seen[key] {
					continue
				}
				seen[key] = true
				byGPU[c.GPU] = append(byGPU[c.GPU], claimSeries{claim: c, pod: pod})
			}
		}
		for gpu, series := range byGPU {
			m.collectGPU(ch, node, gpu, series, limit)
		}
	}
}

func (m *ClaimMetrics) collectGPU(ch chan<- prometheus.Metric, node, gpu string, series []claimSeries, limit int) {
	if n := len(series) - limit; n > 0 {
		// The largest claims first, then by name, so the choice is stable between scrapes.
		slices.SortStableFunc(series, func(a, b claimSeries) int {
			return cmp.Or(cmp.Compare(b.claim.MemoryBytes, a.claim.MemoryBytes), cmp.Compare(a.claim.Namespace, b.claim.Namespace),
				cmp.Compare(a.pod, b.pod), cmp.Compare(a.claim.Name, b.claim.Name))
		})
		series = series[:limit]
		ch <- prometheus.MustNewConstMetric(m.omitted, prometheus.GaugeValue, float64(n), gpu, node)
	}
	for _, s := range series {
		lv := []string{s.claim.Namespace, s.pod, s.claim.Name, gpu, node}
		ch <- prometheus.MustNewConstMetric(m.memory, prometheus.GaugeValue, float64(s.claim.MemoryBytes), lv...)
		ch <- prometheus.MustNewConstMetric(m.compute, prometheus.GaugeValue, float64(s.claim.ComputePercent), lv...)
	}
}
