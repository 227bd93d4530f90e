package rightsizing

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	recommendedMemory = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_rightsizing_recommended_memory_bytes",
		Help: "Memory a new claim of the workload's sized request would get (initialMemory of its GPUShareRecommendation).",
	}, []string{"namespace", "recommendation", "kind", "workload"})
	requestedMemory = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_rightsizing_requested_memory_bytes",
		Help: "Memory the workload's newest claim of the sized request was allocated.",
	}, []string{"namespace", "recommendation", "kind", "workload"})
	freeableMemory = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpusharing_rightsizing_freeable_memory_bytes",
		Help: "Memory the claims seen in the last sample intervals would free together if each had its recommended size.",
	})
)

func init() {
	metrics.Registry.MustRegister(recommendedMemory, requestedMemory, freeableMemory)
}

// recordMetrics sets the series from what was last written; workloads gone leave with their entries.
func (r *Rightsizer) recordMetrics(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	recommendedMemory.Reset()
	requestedMemory.Reset()
	var free float64
	for key, e := range r.entries {
		labels := []string{key.Namespace, key.Name, string(e.t.Workload.Kind), e.t.Workload.Name}
		if e.claimMemory > 0 {
			requestedMemory.WithLabelValues(labels...).Set(float64(e.claimMemory))
		}
		if e.written == nil || e.written.InitialMemory == nil {
			continue
		}
		initial := e.written.InitialMemory.Value()
		recommendedMemory.WithLabelValues(labels...).Set(float64(initial))
		shares := 0
		for _, seen := range e.claims {
			if now.Sub(seen) <= r.expire() {
				shares++
			}
		}
		free += float64(max(e.claimMemory-initial, 0) * int64(shares))
	}
	freeableMemory.Set(free)
}
