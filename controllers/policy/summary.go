package policy

import (
	"fmt"
	"sort"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// NodeView is one node as the status aggregation sees it: its GPUNode and its Node's labels.
type NodeView struct {
	GPUNode *v1.GPUNode
	Labels  map[string]string
}

// GPURef names one GPU for people: node and NVML index.
type GPURef struct {
	Node  string
	Index int32
}

func (g GPURef) String() string { return fmt.Sprintf("node %s GPU %d", g.Node, g.Index) }

// Failure is a GPU the agent could not configure as the policy declares, in the agent's words.
type Failure struct {
	GPURef
	Reason  string
	Message string
}

func (f Failure) String() string { return fmt.Sprintf("%s: %s", f.GPURef, f.Message) }

// Conflict is another policy of equal priority selecting some of the same GPUs.
type Conflict struct {
	Other  string
	GPUs   int
	Winner string
}

// Summary is what the policy's status says, recomputed from the objects on every pass.
type Summary struct {
	MatchedNodes, MatchedGPUs, ReadyGPUs int
	// WaitingNodes hold GPUs this policy wins whose disruptive change waits for the rollout budget.
	WaitingNodes []string
	// InFlightNodes have a disruptive change of this policy written but not yet applied.
	InFlightNodes []string
	// Applying lists GPUs whose desired sharing is written (or going out at once) but not yet applied.
	Applying  []GPURef
	Failures  []Failure
	Conflicts []Conflict
	// SelectorErr is set when the policy's nodeSelector cannot be parsed.
	SelectorErr error
}

// Summarize aggregates the policy's standing over every node. compiled must be resolve.Compile of all
// policies, so the policy wins exactly the GPUs the resolver gives it.
func Summarize(p *v1.GPUSharingPolicy, compiled []resolve.Compiled, nodes []NodeView) Summary {
	var s Summary
	for _, c := range compiled {
		if c.Policy.Name == p.Name {
			s.SelectorErr = c.Err
		}
	}
	waiting := map[string]bool{}
	conflicts := map[string]*Conflict{}
	// Every entry that is current carries exactly the policy's sharing, so one hash serves them all.
	hash, shape := v1.SharingHash(p.Spec.Sharing), sharing.ShapeOf(p.Spec.Sharing)
	for _, nv := range nodes {
		gn := nv.GPUNode
		if len(gn.Status.GPUs) == 0 {
			continue
		}
		matched, inFlight := false, false
		for _, r := range resolve.ResolveNode(compiled, nv.Labels, gn.Status.GPUs) {
			noteConflicts(p.Name, r, conflicts)
			if r.Winner == nil || r.Winner.Name != p.Name {
				continue
			}
			matched = true
			s.MatchedGPUs++
			ref := GPURef{Node: gn.Name, Index: r.GPU.Index}
			entry := resolve.FindDesired(gn.Spec.GPUs, r.GPU.UUID)
			if !current(entry, p) {
				var written *v1.Sharing
				if entry != nil {
					written = &entry.Sharing
				}
				if resolve.ChangeIsDisruptive(written, r.GPU.Applied, p.Spec.Sharing) {
					waiting[gn.Name] = true
				} else {
					s.Applying = append(s.Applying, ref)
				}
				continue
			}
			st := resolve.StateOfHashed(gn, entry, hash)
			switch st.Phase {
			case resolve.PhaseApplied:
				s.ReadyGPUs++
			case resolve.PhaseFailed:
				s.Failures = append(s.Failures, Failure{GPURef: ref, Reason: st.Reason, Message: st.Message})
			default:
				s.Applying = append(s.Applying, ref)
			}
			inFlight = inFlight || resolve.DisruptionInFlight(st, r.GPU, shape)
		}
		if matched {
			s.MatchedNodes++
		}
		if inFlight {
			s.InFlightNodes = append(s.InFlightNodes, gn.Name)
		}
	}
	for n := range waiting {
		s.WaitingNodes = append(s.WaitingNodes, n)
	}
	sort.Strings(s.WaitingNodes)
	sort.Strings(s.InFlightNodes)
	sortRefs(s.Applying)
	sort.Slice(s.Failures, func(i, j int) bool { return less(s.Failures[i].GPURef, s.Failures[j].GPURef) })
	for _, c := range conflicts {
		s.Conflicts = append(s.Conflicts, *c)
	}
	sort.Slice(s.Conflicts, func(i, j int) bool { return s.Conflicts[i].Other < s.Conflicts[j].Other })
	return s
}

// current says whether the spec entry carries this generation of the policy; the resolver writes a
// policy's sharing together with its generation, so name and generation identify the sharing.
func current(entry *v1.GPUDesired, p *v1.GPUSharingPolicy) bool {
	return entry != nil && entry.Policy == p.Name && entry.PolicyGeneration == p.Generation
}

// noteConflicts counts, for the policy, the GPUs it ties for with each other policy.
func noteConflicts(name string, r resolve.GPUResolution, into map[string]*Conflict) {
	if !r.Conflicted() {
		return
	}
	involved := false
	for _, t := range r.Tied {
		if t.Name == name {
			involved = true
		}
	}
	if !involved {
		return
	}
	for _, t := range r.Tied {
		if t.Name == name {
			continue
		}
		c := into[t.Name]
		if c == nil {
			c = &Conflict{Other: t.Name, Winner: r.Winner.Name}
			into[t.Name] = c
		}
		c.GPUs++
	}
}

func less(a, b GPURef) bool {
	if a.Node != b.Node {
		return a.Node < b.Node
	}
	return a.Index < b.Index
}

func sortRefs(refs []GPURef) {
	sort.Slice(refs, func(i, j int) bool { return less(refs[i], refs[j]) })
}
