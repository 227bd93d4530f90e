package policy

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// GPU states reported by gpusharing_policy_gpus; node states by gpusharing_policy_nodes.
const (
	stateMatched    = "matched"
	stateReady      = "ready"
	stateApplying   = "applying"
	stateWaiting    = "waiting"
	stateDegraded   = "degraded"
	stateConflicted = "conflicted"
	stateInFlight   = "inflight"
)

var (
	policyGPUs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_policy_gpus",
		Help: "GPUs per policy by state: matched (the policy wins them), ready (applied as desired), applying, degraded (the agent reports a failure), conflicted (contested at equal priority).",
	}, []string{"policy", "state"})
	policyNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpusharing_policy_nodes",
		Help: "Nodes per policy by state: matched, inflight (a disruptive change applying), waiting (for the rollout budget).",
	}, []string{"policy", "state"})
)

func init() {
	metrics.Registry.MustRegister(policyGPUs, policyNodes)
}

func recordMetrics(policy string, s Summary) {
	s = s.withCounts()
	conflicted := 0
	for _, c := range s.Conflicts {
		conflicted += c.GPUs
	}
	policyGPUs.WithLabelValues(policy, stateMatched).Set(float64(s.MatchedGPUs))
	policyGPUs.WithLabelValues(policy, stateReady).Set(float64(s.ReadyGPUs))
	policyGPUs.WithLabelValues(policy, stateApplying).Set(float64(s.ApplyingCount))
	policyGPUs.WithLabelValues(policy, stateDegraded).Set(float64(s.FailureCount))
	policyGPUs.WithLabelValues(policy, stateConflicted).Set(float64(conflicted))
	policyNodes.WithLabelValues(policy, stateMatched).Set(float64(s.MatchedNodes))
	policyNodes.WithLabelValues(policy, stateInFlight).Set(float64(s.InFlightCount))
	policyNodes.WithLabelValues(policy, stateWaiting).Set(float64(s.WaitingCount))
}

// forgetMetrics drops a deleted policy's series, so dashboards do not show a ghost.
func forgetMetrics(policy string) {
	policyGPUs.DeletePartialMatch(prometheus.Labels{"policy": policy})
	policyNodes.DeletePartialMatch(prometheus.Labels{"policy": policy})
}
