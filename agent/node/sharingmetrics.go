package node

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Drain outcomes of gpusharing_agent_drain_duration_seconds.
const (
	drainOutcomeDrained  = "drained"
	drainOutcomeTimedOut = "timed_out"
	drainOutcomeFailed   = "failed"
)

var (
	drainDurationMetric = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "gpusharing_agent_drain_duration_seconds",
		Help: "Time from cordoning a GPU to the end of its drain before a disruptive change, by outcome (drained, timed_out, failed).",
		// Drains wait for pods to end: seconds for an idle GPU, up to the timeout (10m by default) and beyond.
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600},
	}, []string{"gpu", "outcome"})
	sharingInfoMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_agent_gpu_sharing_info",
		Help: "1 per GPU, labelled with its index, the declared sharing (the GPUNode's spec; none when no policy lists the GPU) and the sharing in force (its status).",
	}, []string{"gpu", "index", "declared", "applied"})
)

// sharingInfo remembers each GPU's current label set, so that a change of sharing replaces the GPU's
// series instead of leaving the old one at 1 beside the new.
var sharingInfo = struct {
	mu   sync.Mutex
	last map[string][]string
}{last: map[string][]string{}}

func init() {
	metrics.Registry.MustRegister(drainDurationMetric, sharingInfoMetric)
}

// observeDrain records a drain that ended, from the cordon to now.
func observeDrain(uuid string, started, now time.Time, outcome string) {
	if started.IsZero() {
		return
	}
	drainDurationMetric.WithLabelValues(uuid, outcome).Observe(max(now.Sub(started), 0).Seconds())
}

// recordSharingInfo publishes declared against applied sharing per GPU, in the words of the node summary.
func recordSharingInfo(spec v1alpha1.GPUNodeSpec, st v1alpha1.GPUNodeStatus) {
	declared := map[string]string{}
	for _, d := range spec.GPUs {
		declared[d.UUID] = declaredToken(d.Sharing)
	}
	sharingInfo.mu.Lock()
	defer sharingInfo.mu.Unlock()
	for _, g := range st.GPUs {
		want, ok := declared[g.UUID]
		if !ok {
			want = "none"
		}
		// The applied token without the "!Reason" suffix: the reason is the Applied condition's business.
		labels := []string{g.UUID, strconv.Itoa(int(g.Index)), want, token(v1alpha1.GPUStatus{Applied: g.Applied})}
		if old, ok := sharingInfo.last[g.UUID]; ok && !equalStrings(old, labels) {
			sharingInfoMetric.DeleteLabelValues(old...)
		}
		sharingInfo.last[g.UUID] = labels
		sharingInfoMetric.WithLabelValues(labels...).Set(1)
	}
}

// declaredToken renders a desired sharing like the node summary renders an applied one
// ("TimeSlicing×4+Oversub", "MIG(3g.40gb,1g.10gb×4)").
func declaredToken(s v1alpha1.Sharing) string {
	a := &v1alpha1.AppliedSharing{Strategy: s.Strategy, MPS: nil, TimeSlicing: s.TimeSlicing}
	if s.MPS != nil {
		a.MPS = &v1alpha1.MPSStatus{Replicas: s.MPS.Replicas}
	}
	if s.MIG != nil {
		for _, in := range s.MIG.Instances {
			for range in.Count {
				a.MIGInstances = append(a.MIGInstances, v1alpha1.MIGInstanceStatus{Profile: in.Profile})
			}
		}
	}
	if s.Oversubscription != nil {
		a.Shim = &v1alpha1.ShimStatus{}
	}
	return token(v1alpha1.GPUStatus{Applied: a})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
