package resolve

import (
	"sort"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// Phase is where one listed GPU stands against its desired sharing, as the agent reports it.
type Phase int

const (
	// PhaseApplying: the agent has not yet reported the desired sharing in force (or is draining).
	PhaseApplying Phase = iota
	// PhaseApplied: the agent reports exactly this desired sharing in force and healthy.
	PhaseApplied
	// PhaseFailed: the agent reports the GPU cannot be configured as desired, or is unhealthy.
	PhaseFailed
	// PhaseGone: the agent no longer reports the GPU.
	PhaseGone
)

// GPUState is a listed GPU's phase with the agent's reason and message when it failed.
type GPUState struct {
	Phase   Phase
	Reason  string
	Message string
}

// stateInput is what the failure checks look at.
type stateInput struct {
	node  *v1.GPUNode
	entry *v1.GPUDesired
	gpu   *v1.GPUStatus
}

// failureCheck is one link of the failure chain: the first that fails names the GPU's failure.
type failureCheck func(in stateInput) (reason, message string, failed bool)

var failureChain = []failureCheck{unhealthy, rejectedByHardware}

// unhealthy: NVML reports the GPU unhealthy (Xid errors, fallen off the bus), whatever is applied.
func unhealthy(in stateInput) (string, string, bool) {
	c := meta.FindStatusCondition(in.gpu.Conditions, v1.ConditionHealthy)
	if c == nil || c.Status != metav1.ConditionFalse {
		return "", "", false
	}
	return c.Reason, c.Message, true
}

// rejectedByHardware: the agent acted on the current spec and reports that the GPU cannot take it. A
// rejection reported before the agent saw the current spec (status.observedGeneration behind) is stale.
func rejectedByHardware(in stateInput) (string, string, bool) {
	if in.node.Status.ObservedGeneration < in.node.Generation {
		return "", "", false
	}
	c := meta.FindStatusCondition(in.gpu.Conditions, v1.ConditionApplied)
	if c == nil || c.Status != metav1.ConditionFalse || !v1.IsHardwareRejection(c.Reason) {
		return "", "", false
	}
	return c.Reason, c.Message, true
}

// FindGPU returns the agent's report of the GPU with the given UUID, or nil.
func FindGPU(gpus []v1.GPUStatus, uuid string) *v1.GPUStatus {
	for i := range gpus {
		if gpus[i].UUID == uuid {
			return &gpus[i]
		}
	}
	return nil
}

// FindDesired returns the spec entry for the GPU with the given UUID, or nil.
func FindDesired(gpus []v1.GPUDesired, uuid string) *v1.GPUDesired {
	for i := range gpus {
		if gpus[i].UUID == uuid {
			return &gpus[i]
		}
	}
	return nil
}

// Acked says whether the agent reports exactly this desired sharing in force: its spec hash matches and
// its Applied condition is True.
func Acked(entry *v1.GPUDesired, gpu *v1.GPUStatus) bool {
	if gpu == nil || gpu.Applied == nil || gpu.Applied.SpecHash != v1.SharingHash(entry.Sharing) {
		return false
	}
	return meta.IsStatusConditionTrue(gpu.Conditions, v1.ConditionApplied)
}

// StateOf places one spec entry of a GPUNode against the agent's report.
func StateOf(node *v1.GPUNode, entry *v1.GPUDesired) GPUState {
	return StateOfHashed(node, entry, v1.SharingHash(entry.Sharing))
}

// StateOfHashed is StateOf for a caller that already knows SharingHash(entry.Sharing): hashing is most
// of the cost when the status of thousands of GPUs is aggregated.
func StateOfHashed(node *v1.GPUNode, entry *v1.GPUDesired, hash string) GPUState {
	gpu := FindGPU(node.Status.GPUs, entry.UUID)
	if gpu == nil {
		return GPUState{Phase: PhaseGone}
	}
	in := stateInput{node: node, entry: entry, gpu: gpu}
	for _, check := range failureChain {
		if reason, msg, failed := check(in); failed {
			return GPUState{Phase: PhaseFailed, Reason: reason, Message: msg}
		}
	}
	if gpu.Applied != nil && gpu.Applied.SpecHash == hash && meta.IsStatusConditionTrue(gpu.Conditions, v1.ConditionApplied) {
		return GPUState{Phase: PhaseApplied}
	}
	return GPUState{Phase: PhaseApplying}
}

// DisruptionInFlight says whether a GPU in the given state carries a disruptive change not yet done: it
// is applying and what the agent reports in force has another shape than want (or is unknown).
func DisruptionInFlight(st GPUState, gpu *v1.GPUStatus, want sharing.Shape) bool {
	if st.Phase != PhaseApplying {
		return false
	}
	from, ok := sharing.AppliedShape(gpu.Applied)
	return !ok || sharing.Disruptive(from, want)
}

// InFlightPolicies names the policies for which this node has a disruptive change in flight: a spec
// entry of the policy that the agent has neither reported applied nor rejected, and whose strategy or MIG
// layout differs from what the agent reports in force. It reads only the object, so it serves as a cache
// index and survives a controller restart.
func InFlightPolicies(node *v1.GPUNode) []string {
	var out []string
	seen := map[string]bool{}
	for i := range node.Spec.GPUs {
		e := &node.Spec.GPUs[i]
		if e.Policy == "" || seen[e.Policy] {
			continue
		}
		if !DisruptionInFlight(StateOf(node, e), FindGPU(node.Status.GPUs, e.UUID), sharing.ShapeOf(e.Sharing)) {
			continue
		}
		seen[e.Policy] = true
		out = append(out, e.Policy)
	}
	sort.Strings(out)
	return out
}
