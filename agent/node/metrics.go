package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Metrics mirror the published status, so a fleet dashboard needs no API server queries.
var (
	gpusMetric = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpusharing_agent_gpus", Help: "GPUs NVML reports on this node.",
	})
	appliedGPUsMetric = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpusharing_agent_applied_gpus", Help: "Listed GPUs that run their desired sharing.",
	})
	gpuAppliedMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_agent_gpu_applied", Help: "1 when the GPU's Applied condition is True, else 0.",
	}, []string{"gpu"})
	mpsRestartsMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_agent_mps_daemon_restarts", Help: "How often the agent restarted the GPU's MPS daemon.",
	}, []string{"gpu"})
)

// SchedulerMetrics are the shim schedulers' series (gpusharing_scheduler_*, labelled gpu) on the same
// registry, registered once per process: every GPU's Scheduler, of every agent in the process (the demo
// runs several), shares them, where one registration per Scheduler would collide.
var SchedulerMetrics *scheduler.Metrics

func init() {
	metrics.Registry.MustRegister(gpusMetric, appliedGPUsMetric, gpuAppliedMetric, mpsRestartsMetric)
	m, err := scheduler.NewMetrics(metrics.Registry)
	if err != nil {
		panic(err)
	}
	SchedulerMetrics = m
}

// recordMetrics sets the gauges from the status a pass computed.
func recordMetrics(st v1alpha1.GPUNodeStatus) {
	gpusMetric.Set(float64(st.GPUCount))
	appliedGPUsMetric.Set(float64(st.AppliedGPUs))
	for _, g := range st.GPUs {
		v := 0.0
		if meta.IsStatusConditionPresentAndEqual(g.Conditions, v1alpha1.ConditionApplied, metav1.ConditionTrue) {
			v = 1
		}
		gpuAppliedMetric.WithLabelValues(g.UUID).Set(v)
		if g.Applied != nil && g.Applied.MPS != nil {
			mpsRestartsMetric.WithLabelValues(g.UUID).Set(float64(g.Applied.MPS.Restarts))
		}
	}
}
