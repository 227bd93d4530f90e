package resolve

import (
	"sort"

	"k8s.io/apimachinery/pkg/api/equality"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Wish is what one GPU of a node should be listed with, before rollout admission.
type Wish struct {
	UUID  string
	Index int32
	// Current is the spec entry written today; nil when the GPU is not listed.
	Current *v1.GPUDesired
	// Want is the entry the GPU should have; nil when it should not be listed (left as found).
	Want *v1.GPUDesired
	// Disruptive is set when writing Want disturbs running work, so it waits for the winning policy's
	// rollout budget.
	Disruptive bool
}

// Changed says whether Want differs from Current.
func (w Wish) Changed() bool {
	return !equality.Semantic.DeepEqual(w.Current, w.Want)
}

// Wishes turns a node's resolution into per-GPU wishes. A GPU a policy wins gets that policy's sharing.
// A GPU no policy wins any more, but which a policy configured, goes back to DefaultSharing; that default
// entry stays listed until the agent reports it applied and is then dropped, so the GPU is again "left as
// found" in the state the default guarantees. GPUs the agent no longer reports are dropped.
func Wishes(res []GPUResolution, node *v1.GPUNode) []Wish {
	out := make([]Wish, 0, len(res))
	for _, r := range res {
		w := Wish{UUID: r.GPU.UUID, Index: r.GPU.Index, Current: FindDesired(node.Spec.GPUs, r.GPU.UUID)}
		switch {
		case r.Winner != nil:
			w.Want = desiredFrom(r.Winner, r.GPU)
		case w.Current == nil:
			// Never configured: left as found.
		case w.Current.Policy != "":
			w.Want = &v1.GPUDesired{UUID: r.GPU.UUID, Index: r.GPU.Index, Sharing: DefaultSharing()}
		case !Acked(w.Current, r.GPU):
			w.Want = w.Current.DeepCopy()
		}
		if w.Want != nil && w.Want.Policy != "" && w.Changed() {
			var current *v1.Sharing
			if w.Current != nil {
				current = &w.Current.Sharing
			}
			w.Disruptive = ChangeIsDisruptive(current, r.GPU.Applied, w.Want.Sharing)
		}
		out = append(out, w)
	}
	return out
}

func desiredFrom(p *v1.GPUSharingPolicy, gpu *v1.GPUStatus) *v1.GPUDesired {
	d := &v1.GPUDesired{
		UUID:             gpu.UUID,
		Index:            gpu.Index,
		Policy:           p.Name,
		PolicyGeneration: p.Generation,
		Sharing:          *p.Spec.Sharing.DeepCopy(),
	}
	if p.Spec.Rollout.Drain != nil {
		d.Drain = p.Spec.Rollout.Drain.DeepCopy()
	}
	return d
}

// NeedsAdmission lists, sorted, the policies whose disruptive changes on this node wait for admission.
func NeedsAdmission(wishes []Wish) []string {
	set := map[string]bool{}
	for _, w := range wishes {
		if w.Disruptive {
			set[w.Want.Policy] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Build assembles the node's spec from its wishes: every wish is granted except disruptive ones of a
// policy not admitted, whose GPUs keep their current entry. It returns the spec, ordered by GPU index,
// and the policies the node waits on.
func Build(wishes []Wish, admitted map[string]bool) ([]v1.GPUDesired, []string) {
	var spec []v1.GPUDesired
	waiting := map[string]bool{}
	for _, w := range wishes {
		entry := w.Want
		if w.Disruptive && !admitted[w.Want.Policy] {
			waiting[w.Want.Policy] = true
			entry = w.Current
		}
		if entry != nil {
			spec = append(spec, *entry)
		}
	}
	sort.Slice(spec, func(i, j int) bool {
		if spec[i].Index != spec[j].Index {
			return spec[i].Index < spec[j].Index
		}
		return spec[i].UUID < spec[j].UUID
	})
	out := make([]string, 0, len(waiting))
	for p := range waiting {
		out = append(out, p)
	}
	sort.Strings(out)
	return spec, out
}
