package policy

import (
	"fmt"
	"sort"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
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

// Summary is what the policy's status says. The lists hold the first maxCauses entries in name order
// (what a condition message names); the counts cover everything. A Summary built by hand may leave a
// count zero: it then defaults to its list's length.
type Summary struct {
	MatchedNodes, MatchedGPUs, ReadyGPUs int
	// SelectedNodes are the GPU nodes the policy's nodeSelector selects: a percentage budget's base.
	SelectedNodes int
	// WaitingNodes hold GPUs this policy wins whose disruptive change waits for the rollout budget.
	WaitingNodes []string
	WaitingCount int
	// InFlightNodes have a disruptive change of this policy written but not yet applied.
	InFlightNodes []string
	InFlightCount int
	// Applying lists GPUs whose desired sharing is written (or going out at once) but not yet applied.
	Applying      []GPURef
	ApplyingCount int
	Failures      []Failure
	FailureCount  int
	Conflicts     []Conflict
	// SelectorErr is set when the policy's nodeSelector cannot be parsed.
	SelectorErr error
}

// withCounts fills the counts a hand-built Summary left zero from its lists.
func (s Summary) withCounts() Summary {
	s.WaitingCount = max(s.WaitingCount, len(s.WaitingNodes))
	s.InFlightCount = max(s.InFlightCount, len(s.InFlightNodes))
	s.ApplyingCount = max(s.ApplyingCount, len(s.Applying))
	s.FailureCount = max(s.FailureCount, len(s.Failures))
	return s
}

// Summarize aggregates the policy's standing over the given nodes from scratch, by the same rule the
// reconciler's Tally applies node by node. compiled must be resolve.Compile of all policies, so the
// policy wins exactly the GPUs the resolver gives it.
func Summarize(p *v1.GPUSharingPolicy, compiled []resolve.Compiled, nodes []NodeView) Summary {
	t := NewTally()
	t.facts = factsOf(compiled)
	for _, nv := range nodes {
		t.replace(nv.GPUNode.Name, contribute(compiled, t.facts, nv))
	}
	return t.summaryOf(p, compiled)
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
