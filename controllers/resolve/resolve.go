package resolve

import (
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// GPUResolution is the outcome for one GPU of a node.
type GPUResolution struct {
	// GPU is the GPU as the agent reports it.
	GPU *v1.GPUStatus
	// Winner is the policy that configures the GPU; nil when no policy selects it.
	Winner *v1.GPUSharingPolicy
	// Tied lists every policy that selects the GPU at the winner's priority, the winner first; it has
	// more than one entry exactly when the GPU is in conflict.
	Tied []*v1.GPUSharingPolicy
}

// Conflicted says whether policies of equal priority compete for the GPU.
func (r GPUResolution) Conflicted() bool { return len(r.Tied) > 1 }

// ResolveNode decides, for every GPU the agent reports, which compiled policy wins it. policies must
// come from Compile (ordered by precedence), so the first match wins and the matches that follow at the
// same priority are the conflict.
func ResolveNode(policies []Compiled, nodeLabels map[string]string, gpus []v1.GPUStatus) []GPUResolution {
	onNode := make([]Compiled, 0, len(policies))
	for _, c := range policies {
		if c.SelectsNode(nodeLabels) {
			onNode = append(onNode, c)
		}
	}
	out := make([]GPUResolution, len(gpus))
	for i := range gpus {
		gpu := &gpus[i]
		r := GPUResolution{GPU: gpu}
		for _, c := range onNode {
			if !c.SelectsGPU(gpu) {
				continue
			}
			if r.Winner == nil {
				r.Winner = c.Policy
				r.Tied = append(r.Tied, c.Policy)
				continue
			}
			if c.Policy.Spec.Priority != r.Winner.Spec.Priority {
				break
			}
			r.Tied = append(r.Tied, c.Policy)
		}
		out[i] = r
	}
	return out
}
