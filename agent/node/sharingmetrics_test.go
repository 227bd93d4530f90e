package node

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// sharingInfoFor returns the declared and applied labels of uuid's series and how many series it has.
func sharingInfoFor(t *testing.T, m *Metrics, uuid string) (declared, applied string, series int) {
	t.Helper()
	families, err := gatherOne(m.sharingInfo)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range families {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["gpu"] == uuid {
			declared, applied = labels["declared"], labels["applied"]
			series++
		}
	}
	return declared, applied, series
}

func TestSharingInfoShowsDeclaredAgainstAppliedAndReplacesTheSeriesOnAChange(t *testing.T) {
	const uuid = "GPU-sharing-info-test"
	ts := v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4},
		Oversubscription: &v1alpha1.Oversubscription{}}
	spec := v1alpha1.GPUNodeSpec{GPUs: []v1alpha1.GPUDesired{{UUID: uuid, Sharing: ts}}}
	st := v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{{UUID: uuid, Index: 3, Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive}}}}
	m, _ := NewMetrics(nil)

	m.recordSharing("node-a", spec, st)
	if d, a, n := sharingInfoFor(t, m, uuid); d != "TimeSlicing×4+Oversub" || a != "Exclusive" || n != 1 {
		t.Fatalf("while applying: declared %q applied %q in %d series; want TimeSlicing×4+Oversub against Exclusive in 1", d, a, n)
	}
	st.GPUs[0].Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing,
		TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4}, Shim: &v1alpha1.ShimStatus{}}
	m.recordSharing("node-a", spec, st)
	if d, a, n := sharingInfoFor(t, m, uuid); d != a || n != 1 {
		t.Fatalf("once applied: declared %q applied %q in %d series; want equal labels in one series (the old one removed)", d, a, n)
	}
	m.recordSharing("node-a", v1alpha1.GPUNodeSpec{}, st)
	if d, _, n := sharingInfoFor(t, m, uuid); d != "none" || n != 1 {
		t.Fatalf("no longer listed: declared %q in %d series, want none in 1", d, n)
	}
}

func TestDeclaredTokenReadsLikeTheSummary(t *testing.T) {
	for _, tt := range []struct {
		s    v1alpha1.Sharing
		want string
	}{
		{v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 4}}, "MPS×4"},
		{v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{Instances: []v1alpha1.MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}, {Profile: "1g.10gb", Count: 4}}}}, "MIG(3g.40gb,1g.10gb×4)"},
		{v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive, Oversubscription: &v1alpha1.Oversubscription{}}, "Exclusive+Oversub"},
	} {
		if got := declaredToken(tt.s); got != tt.want {
			t.Errorf("declaredToken(%s) = %q, want %q", tt.s.Strategy, got, tt.want)
		}
	}
}

func TestObserveDrainRecordsOneSamplePerEndedDrain(t *testing.T) {
	const uuid = "GPU-drain-metric-test"
	start := time.Date(2026, 11, 23, 22, 0, 0, 0, time.UTC)
	m, _ := NewMetrics(nil)
	m.observeDrain("node-a", uuid, start, start.Add(90*time.Second), drainOutcomeTimedOut)
	m.observeDrain("node-a", uuid, time.Time{}, start, drainOutcomeTimedOut) // a drain that never started is not one
	h, err := gatherOne(m.drainDuration)
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, m := range h {
		for _, l := range m.GetLabel() {
			if l.GetName() == "gpu" && l.GetValue() == uuid {
				series++
				if c, s := m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(); c != 1 || s != 90 {
					t.Errorf("count %d sum %v, want 1 sample of 90s", c, s)
				}
			}
		}
	}
	if series != 1 {
		t.Errorf("%d series for the GPU, want 1 (timed_out)", series)
	}
}

// gatherOne collects one collector's metrics.
func gatherOne(c prometheus.Collector) ([]*dto.Metric, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	fs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var out []*dto.Metric
	for _, f := range fs {
		out = append(out, f.GetMetric()...)
	}
	return out, nil
}
