package policy

import (
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// contribution is what one node adds to one policy's status. A policy's status is the sum of its
// nodes' contributions, so a node that changes is subtracted and added again instead of every node
// being read again.
type contribution struct {
	// selected: the policy's nodeSelector selects the node (the base of a percentage budget).
	selected bool
	// matched: the policy wins at least one of the node's GPUs.
	matched bool
	// waiting: a GPU the policy wins has a disruptive change waiting for the rollout budget.
	waiting bool
	// inFlight: a disruptive change of the policy is written and not yet applied.
	inFlight               bool
	matchedGPUs, readyGPUs int
	applying               []GPURef
	failures               []Failure
	conflicts              map[string]*Conflict
}

// policyFacts are what every node's contribution needs of one policy, computed once per policy set:
// hashing the sharing is most of the cost of placing a GPU.
type policyFacts struct {
	hash  string
	shape sharing.Shape
}

func factsOf(compiled []resolve.Compiled) map[string]policyFacts {
	out := make(map[string]policyFacts, len(compiled))
	for _, c := range compiled {
		out[c.Policy.Name] = policyFacts{hash: v1.SharingHash(c.Policy.Spec.Sharing), shape: sharing.ShapeOf(c.Policy.Spec.Sharing)}
	}
	return out
}

// contribute resolves one node once and splits what it finds by policy. compiled must be
// resolve.Compile of all policies, so each policy wins exactly the GPUs the resolver gives it.
func contribute(compiled []resolve.Compiled, facts map[string]policyFacts, nv NodeView) map[string]*contribution {
	out := map[string]*contribution{}
	get := func(name string) *contribution {
		c := out[name]
		if c == nil {
			c = &contribution{}
			out[name] = c
		}
		return c
	}
	for _, c := range compiled {
		if c.SelectsNode(nv.Labels) {
			get(c.Policy.Name).selected = true
		}
	}
	gn := nv.GPUNode
	if len(gn.Status.GPUs) == 0 {
		return out
	}
	for _, r := range resolve.ResolveNode(compiled, nv.Labels, gn.Status.GPUs) {
		if r.Conflicted() {
			noteConflicts(r, get)
		}
		if r.Winner == nil {
			continue
		}
		p, f := r.Winner, facts[r.Winner.Name]
		c := get(p.Name)
		c.matched = true
		c.matchedGPUs++
		ref := GPURef{Node: gn.Name, Index: r.GPU.Index}
		entry := resolve.FindDesired(gn.Spec.GPUs, r.GPU.UUID)
		if !current(entry, p) {
			var written *v1.Sharing
			if entry != nil {
				written = &entry.Sharing
			}
			if resolve.ChangeIsDisruptive(written, r.GPU.Applied, p.Spec.Sharing) {
				c.waiting = true
			} else {
				c.applying = append(c.applying, ref)
			}
			continue
		}
		st := resolve.StateOfHashed(gn, entry, f.hash)
		switch st.Phase {
		case resolve.PhaseApplied:
			c.readyGPUs++
		case resolve.PhaseFailed:
			c.failures = append(c.failures, Failure{GPURef: ref, Reason: st.Reason, Message: st.Message})
		default:
			c.applying = append(c.applying, ref)
		}
		c.inFlight = c.inFlight || resolve.DisruptionInFlight(st, r.GPU, f.shape)
	}
	for name, c := range out {
		sortRefs(c.applying)
		if !c.selected && !c.matched && len(c.conflicts) == 0 {
			delete(out, name)
		}
	}
	return out
}

// current says whether the spec entry carries this generation of the policy; the resolver writes a
// policy's sharing together with its generation, so name and generation identify the sharing.
func current(entry *v1.GPUDesired, p *v1.GPUSharingPolicy) bool {
	return entry != nil && entry.Policy == p.Name && entry.PolicyGeneration == p.Generation
}

// noteConflicts counts, for every policy tied for the GPU, the GPU against each other tied policy.
func noteConflicts(r resolve.GPUResolution, get func(string) *contribution) {
	for _, a := range r.Tied {
		for _, o := range r.Tied {
			if o.Name == a.Name {
				continue
			}
			c := get(a.Name)
			if c.conflicts == nil {
				c.conflicts = map[string]*Conflict{}
			}
			k := c.conflicts[o.Name]
			if k == nil {
				k = &Conflict{Other: o.Name, Winner: r.Winner.Name}
				c.conflicts[o.Name] = k
			}
			k.GPUs++
		}
	}
}
