package resolve

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Compiled is a policy with its node selector parsed once, so matching a thousand nodes does not parse
// the selector a thousand times.
type Compiled struct {
	Policy   *v1.GPUSharingPolicy
	selector labels.Selector
	// Err is set when the node selector cannot be parsed; such a policy selects nothing.
	Err error
}

// Compile parses the node selectors of the policies that are not being deleted and orders them by
// precedence: priority (highest first), then creation time (oldest first), then name. A deleting policy
// is no candidate: its GPUs go back to the default while its finalizer holds the object.
func Compile(policies []*v1.GPUSharingPolicy) []Compiled {
	out := make([]Compiled, 0, len(policies))
	for _, p := range policies {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		c := Compiled{Policy: p}
		c.selector, c.Err = p.Spec.NodeSelector.Selector()
		if c.Err != nil {
			c.selector, c.Err = labels.Nothing(), fmt.Errorf("nodeSelector: %w", c.Err)
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool { return Precedes(out[i].Policy, out[j].Policy) })
	return out
}

// Precedes says whether a wins over b when both select a GPU: higher priority wins; equal priority is a
// conflict that the oldest policy (then the smallest name) wins, so every reconciler decides the same way.
func Precedes(a, b *v1.GPUSharingPolicy) bool {
	if a.Spec.Priority != b.Spec.Priority {
		return a.Spec.Priority > b.Spec.Priority
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// SelectsNode says whether the policy's nodeSelector matches the node's labels.
func (c Compiled) SelectsNode(nodeLabels map[string]string) bool {
	if c.Err != nil {
		return false
	}
	return c.selector.Matches(labels.Set(nodeLabels))
}

// SelectsGPU says whether the policy's gpus selector matches the GPU as the agent reports it.
func (c Compiled) SelectsGPU(gpu *v1.GPUStatus) bool {
	return GPUSelected(c.Policy.Spec.GPUs, gpu)
}

// GPUSelected matches one GPU against a gpus selector: by product name, NVML index or UUID (UUIDs compare
// without regard to case, as NVML and users spell them both ways). A nil selector selects every GPU.
func GPUSelected(sel *v1.GPUSelector, gpu *v1.GPUStatus) bool {
	switch {
	case sel == nil:
		return true
	case len(sel.Products) > 0:
		for _, p := range sel.Products {
			if p == gpu.Product {
				return true
			}
		}
	case len(sel.Indices) > 0:
		for _, i := range sel.Indices {
			if i == gpu.Index {
				return true
			}
		}
	case len(sel.UUIDs) > 0:
		for _, u := range sel.UUIDs {
			if strings.EqualFold(u, gpu.UUID) {
				return true
			}
		}
	default:
		// An empty selector object is refused at admission; treat it like an omitted one.
		return true
	}
	return false
}

// Selector is the parsed nodeSelector (labels.Nothing when it could not be parsed).
func (c Compiled) Selector() labels.Selector { return c.selector }
