package resolve

import (
	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// MaxUnavailable is how many nodes may have a disruptive change of the policy in flight at once. A
// percentage is taken of selectedNodes (the GPU nodes the policy's nodeSelector selects), rounded down;
// the result is never below one, or a rollout could never start.
func MaxUnavailable(r v1.Rollout, selectedNodes int) int {
	mu := intstr.FromInt32(1)
	if r.MaxUnavailable != nil {
		mu = *r.MaxUnavailable
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(&mu, selectedNodes, false)
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// IsPercentage says whether the budget is a percentage, the only case that needs the node count.
func IsPercentage(r v1.Rollout) bool {
	return r.MaxUnavailable != nil && r.MaxUnavailable.Type == intstr.String
}

// Admit says whether a node may start a disruptive change: it may when it already has one in flight for
// the policy (more GPUs on the same node disturb no further node), or when fewer than limit other nodes do.
func Admit(alreadyInFlight bool, othersInFlight, limit int) bool {
	return alreadyInFlight || othersInFlight < limit
}
