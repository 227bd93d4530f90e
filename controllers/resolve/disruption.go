package resolve

import (
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// ChangeIsDisruptive says whether writing want for a GPU disturbs running work. It does when the shape
// differs from the desired state already written (current, nil when the GPU is not listed) or from what
// the agent reports in force; a GPU whose applied state the agent does not report is treated as
// disrupted, because the agent may have to empty it. Checking both baselines matters: a GPU whose
// written change is still in flight would otherwise pass to another policy without that policy's budget.
func ChangeIsDisruptive(current *v1.Sharing, applied *v1.AppliedSharing, want v1.Sharing) bool {
	to := sharing.ShapeOf(want)
	if current != nil && sharing.Disruptive(sharing.ShapeOf(*current), to) {
		return true
	}
	from, ok := sharing.AppliedShape(applied)
	if !ok {
		return true
	}
	return sharing.Disruptive(from, to)
}

// DefaultSharing is what a GPU returns to when the policy that configured it goes away or stops
// selecting it: Exclusive, the state a GPU has out of the box and the one that never surprises a pod
// (one pod, the whole GPU, no daemon, no partitions).
func DefaultSharing() v1.Sharing {
	return v1.Sharing{Strategy: v1.StrategyExclusive}
}
