package node

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/prom"
)

func appliedGPU(uuid string, mpsRestarts int32) v1alpha1.GPUStatus {
	g := v1alpha1.GPUStatus{UUID: uuid, Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionApplied, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAsDesired}}}
	if mpsRestarts >= 0 {
		g.Applied.MPS = &v1alpha1.MPSStatus{Restarts: mpsRestarts}
	}
	return g
}

func TestMetricsOfAGPUThatLeftAreDeleted(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.record("n1", v1alpha1.GPUNodeStatus{GPUCount: 2, GPUs: []v1alpha1.GPUStatus{appliedGPU("GPU-a", 3), appliedGPU("GPU-b", -1)}})
	m.record("n2", v1alpha1.GPUNodeStatus{GPUCount: 1, GPUs: []v1alpha1.GPUStatus{appliedGPU("GPU-a", -1)}})
	if got := prom.GaugeValue(t, m.gpuApplied.WithLabelValues("n1", "GPU-b")); got != 1 {
		t.Fatalf("gpu_applied{n1,GPU-b} = %v, want 1", got)
	}
	if got := seriesOf(m.gpuApplied); got != 3 {
		t.Fatalf("%d gpu_applied series, want 3 (two nodes kept apart)", got)
	}
	// GPU-b leaves n1 and GPU-a leaves MPS.
	m.record("n1", v1alpha1.GPUNodeStatus{GPUCount: 1, GPUs: []v1alpha1.GPUStatus{appliedGPU("GPU-a", -1)}})
	if got := seriesOf(m.gpuApplied); got != 2 {
		t.Errorf("%d gpu_applied series after GPU-b left n1, want 2", got)
	}
	if got := seriesOf(m.mpsRestarts); got != 0 {
		t.Errorf("%d mps_daemon_restarts series after GPU-a left MPS, want 0", got)
	}
	if got := prom.GaugeValue(t, m.gpus.WithLabelValues("n2")); got != 1 {
		t.Errorf("n2's gpus = %v: another node's pass changed it", got)
	}
}

func TestAgentsOfOneProcessShareTheRegisteredMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("a second agent's metrics: %v", err)
	}
	if a != b {
		t.Error("a second agent got metrics of its own, which no registry exports")
	}
}

// seriesOf counts the series a collector exports.
func seriesOf(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

// A GPU's drain histograms exist at zero for every outcome from its first pass: increase() reads nothing
// in a series born at its first observation, so the GPU's first timed-out drain must find its series.
func TestEveryDrainOutcomeIsPublishedAtZeroAndLeavesWithTheGPU(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.record("n1", v1alpha1.GPUNodeStatus{GPUCount: 2, GPUs: []v1alpha1.GPUStatus{appliedGPU("GPU-a", -1), appliedGPU("GPU-b", -1)}})
	if got, want := seriesOf(m.drainDuration), 2*len(drainOutcomes); got != want {
		t.Fatalf("%d drain_duration series before any drain, want %d (every outcome of both GPUs)", got, want)
	}
	for _, o := range []string{drainOutcomeDrained, drainOutcomeTimedOut, drainOutcomeFailed} {
		h := &dto.Metric{}
		if err := m.drainDuration.WithLabelValues("n1", "GPU-a", o).(prometheus.Histogram).Write(h); err != nil {
			t.Fatal(err)
		}
		if c := h.GetHistogram().GetSampleCount(); c != 0 {
			t.Errorf("%s: %d drains before any drain", o, c)
		}
	}
	m.record("n1", v1alpha1.GPUNodeStatus{GPUCount: 1, GPUs: []v1alpha1.GPUStatus{appliedGPU("GPU-a", -1)}})
	if got, want := seriesOf(m.drainDuration), len(drainOutcomes); got != want {
		t.Errorf("%d drain_duration series after GPU-b left, want %d", got, want)
	}
}
