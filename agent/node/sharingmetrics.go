package node

import (
	"slices"
	"strconv"
	"time"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Drain outcomes of gpusharing_agent_drain_duration_seconds.
const (
	drainOutcomeDrained  = "drained"
	drainOutcomeTimedOut = "timed_out"
	drainOutcomeFailed   = "failed"
)

var drainOutcomes = []string{drainOutcomeDrained, drainOutcomeTimedOut, drainOutcomeFailed}

// observeDrain records a drain that ended, from the cordon to now. A nil *Metrics records nothing.
func (m *Metrics) observeDrain(node, uuid string, started, now time.Time, outcome string) {
	if m == nil || started.IsZero() {
		return
	}
	m.drainDuration.WithLabelValues(node, uuid, outcome).Observe(max(now.Sub(started), 0).Seconds())
}

// recordSharing publishes declared against applied sharing per GPU, in the words of the node summary.
func (m *Metrics) recordSharing(node string, spec v1alpha1.GPUNodeSpec, st v1alpha1.GPUNodeStatus) {
	if m == nil {
		return
	}
	declared := map[string]string{}
	for _, d := range spec.GPUs {
		declared[d.UUID] = declaredToken(d.Sharing)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	last := m.sharingLast[node]
	if last == nil {
		last = map[string][]string{}
		m.sharingLast[node] = last
	}
	for _, g := range st.GPUs {
		want, ok := declared[g.UUID]
		if !ok {
			want = "none"
		}
		// The applied token without the "!Reason" suffix: the reason is the Applied condition's business.
		labels := []string{node, g.UUID, strconv.Itoa(int(g.Index)), want, token(v1alpha1.GPUStatus{Applied: g.Applied})}
		if old, ok := last[g.UUID]; ok && !slices.Equal(old, labels) {
			m.sharingInfo.DeleteLabelValues(old...)
		}
		last[g.UUID] = labels
		m.sharingInfo.WithLabelValues(labels...).Set(1)
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
