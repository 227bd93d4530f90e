package policy

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// Tally keeps every policy's status as running sums of per-node contributions. Node and GPUNode events
// mark their node dirty; a status pass re-reads only the dirty nodes from the cache, subtracts what
// each contributed before and adds what it contributes now. A pass during a rollout therefore costs
// the nodes that changed since the last one, not the fleet. Only a change of the policy set (a spec
// change, a policy created or deleted: anything that can move a GPU from one policy to another) makes
// the next pass read every GPUNode again, once.
type Tally struct {
	dirtyMu sync.Mutex
	dirty   map[string]bool

	mu sync.Mutex
	// key identifies the policy set the contributions were computed with; "" before the first pass.
	key    string
	facts  map[string]policyFacts
	nodes  map[string]map[string]*contribution
	totals map[string]*totals
}

// totals is one policy's sum over its nodes. The sets name nodes; conditions need the first few in
// name order, and a set of names is cheap to scan compared with resolving every GPUNode.
type totals struct {
	selected, matchedNodes, matchedGPUs, readyGPUs, applyingGPUs, failedGPUs int
	waiting, inFlight, applying, failing                                     map[string]bool
	conflicts                                                                map[string]*Conflict
}

func newTotals() *totals {
	return &totals{waiting: map[string]bool{}, inFlight: map[string]bool{}, applying: map[string]bool{},
		failing: map[string]bool{}, conflicts: map[string]*Conflict{}}
}

// NewTally returns an empty tally; its first pass reads every GPUNode.
func NewTally() *Tally {
	return &Tally{dirty: map[string]bool{}, nodes: map[string]map[string]*contribution{}, totals: map[string]*totals{}}
}

// MarkDirty notes that the named node's GPUNode or Node changed. It is called from informer event
// handlers, so it only takes a short lock.
func (t *Tally) MarkDirty(name string) {
	t.dirtyMu.Lock()
	t.dirty[name] = true
	t.dirtyMu.Unlock()
}

func (t *Tally) takeDirty() map[string]bool {
	t.dirtyMu.Lock()
	defer t.dirtyMu.Unlock()
	d := t.dirty
	t.dirty = map[string]bool{}
	return d
}

// Summary brings the tally up to date with the cache and returns policy p's summary. compiled must be
// resolve.Compile of every policy in the cache.
func (t *Tally) Summary(ctx context.Context, c client.Reader, compiled []resolve.Compiled, p *v1.GPUSharingPolicy) (Summary, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.refresh(ctx, c, compiled); err != nil {
		return Summary{}, err
	}
	return t.summaryOf(p, compiled), nil
}

func (t *Tally) refresh(ctx context.Context, c client.Reader, compiled []resolve.Compiled) error {
	if key := policySetKey(compiled); key != t.key {
		var gns v1.GPUNodeList
		if err := c.List(ctx, &gns, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("listing GPUNodes: %w", err)
		}
		for i := range gns.Items {
			t.MarkDirty(gns.Items[i].Name)
		}
		t.key, t.facts = key, factsOf(compiled)
		t.nodes, t.totals = map[string]map[string]*contribution{}, map[string]*totals{}
	}
	dirty := t.takeDirty()
	for name := range dirty {
		if err := t.recompute(ctx, c, compiled, name); err != nil {
			for n := range dirty {
				t.MarkDirty(n)
			}
			return err
		}
		delete(dirty, name)
	}
	return nil
}

// recompute replaces one node's contributions with what its cached GPUNode and Node say now.
func (t *Tally) recompute(ctx context.Context, c client.Reader, compiled []resolve.Compiled, name string) error {
	var now map[string]*contribution
	gn := &v1.GPUNode{}
	err := c.Get(ctx, client.ObjectKey{Name: name}, gn, client.UnsafeDisableDeepCopy)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("getting GPUNode %s: %w", name, err)
	default:
		node := nodeMeta()
		err := c.Get(ctx, client.ObjectKey{Name: name}, node, client.UnsafeDisableDeepCopy)
		switch {
		case apierrors.IsNotFound(err):
			// The resolver deletes a GPUNode whose Node is gone; until then it configures nothing.
		case err != nil:
			return fmt.Errorf("getting Node %s: %w", name, err)
		default:
			now = contribute(compiled, t.facts, NodeView{GPUNode: gn, Labels: node.Labels})
		}
	}
	t.replace(name, now)
	return nil
}

// replace swaps the node's contributions in the totals.
func (t *Tally) replace(name string, now map[string]*contribution) {
	for policy, old := range t.nodes[name] {
		t.totalsOf(policy).add(name, old, -1)
	}
	for policy, c := range now {
		t.totalsOf(policy).add(name, c, +1)
	}
	if len(now) == 0 {
		delete(t.nodes, name)
	} else {
		t.nodes[name] = now
	}
}

func (t *Tally) totalsOf(policy string) *totals {
	s := t.totals[policy]
	if s == nil {
		s = newTotals()
		t.totals[policy] = s
	}
	return s
}

// add adds (sign +1) or subtracts (sign -1) one node's contribution.
func (s *totals) add(node string, c *contribution, sign int) {
	s.selected += sign * b2i(c.selected)
	s.matchedNodes += sign * b2i(c.matched)
	s.matchedGPUs += sign * c.matchedGPUs
	s.readyGPUs += sign * c.readyGPUs
	s.applyingGPUs += sign * len(c.applying)
	s.failedGPUs += sign * len(c.failures)
	setIf(s.waiting, node, c.waiting, sign)
	setIf(s.inFlight, node, c.inFlight, sign)
	setIf(s.applying, node, len(c.applying) > 0, sign)
	setIf(s.failing, node, len(c.failures) > 0, sign)
	for other, k := range c.conflicts {
		sum := s.conflicts[other]
		if sum == nil {
			sum = &Conflict{Other: other, Winner: k.Winner}
			s.conflicts[other] = sum
		}
		sum.GPUs += sign * k.GPUs
		if sum.GPUs <= 0 {
			delete(s.conflicts, other)
		}
	}
}

func setIf(set map[string]bool, node string, member bool, sign int) {
	switch {
	case !member:
	case sign > 0:
		set[node] = true
	default:
		delete(set, node)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// summaryOf turns p's totals into a Summary whose lists hold the first maxCauses entries in name order
// (all a condition message names) and whose counts cover everything.
func (t *Tally) summaryOf(p *v1.GPUSharingPolicy, compiled []resolve.Compiled) Summary {
	var s Summary
	for _, c := range compiled {
		if c.Policy.Name == p.Name {
			s.SelectorErr = c.Err
		}
	}
	tot := t.totals[p.Name]
	if tot == nil {
		tot = newTotals()
	}
	s.SelectedNodes = tot.selected
	s.MatchedNodes, s.MatchedGPUs, s.ReadyGPUs = tot.matchedNodes, tot.matchedGPUs, tot.readyGPUs
	s.WaitingNodes, s.WaitingCount = firstNames(tot.waiting), len(tot.waiting)
	s.InFlightNodes, s.InFlightCount = firstNames(tot.inFlight), len(tot.inFlight)
	for _, n := range firstNames(tot.applying) {
		s.Applying = append(s.Applying, t.nodes[n][p.Name].applying...)
	}
	s.Applying, s.ApplyingCount = s.Applying[:min(len(s.Applying), maxCauses)], tot.applyingGPUs
	for _, n := range firstNames(tot.failing) {
		s.Failures = append(s.Failures, t.nodes[n][p.Name].failures...)
	}
	s.Failures, s.FailureCount = s.Failures[:min(len(s.Failures), maxCauses)], tot.failedGPUs
	for _, c := range tot.conflicts {
		s.Conflicts = append(s.Conflicts, *c)
	}
	sort.Slice(s.Conflicts, func(i, j int) bool { return s.Conflicts[i].Other < s.Conflicts[j].Other })
	return s
}

// firstNames returns the maxCauses smallest names of set, sorted, in one scan of the set.
func firstNames(set map[string]bool) []string {
	var out []string
	for n := range set {
		i := sort.SearchStrings(out, n)
		if i >= maxCauses {
			continue
		}
		out = append(out, "")
		copy(out[i+1:], out[i:])
		out[i] = n
		if len(out) > maxCauses {
			out = out[:maxCauses]
		}
	}
	return out
}

// policySetKey identifies everything about the policy set that decides which policy wins a GPU and
// what it wants: names, generations (every spec change), creation times (tie-breaks) and uids (a
// policy deleted and created again under the same name).
func policySetKey(compiled []resolve.Compiled) string {
	var sb strings.Builder
	for _, c := range compiled {
		sb.WriteString(c.Policy.Name)
		sb.WriteByte('/')
		sb.WriteString(string(c.Policy.UID))
		sb.WriteByte('/')
		sb.WriteString(strconv.FormatInt(c.Policy.Generation, 10))
		sb.WriteByte('/')
		sb.WriteString(strconv.FormatInt(c.Policy.CreationTimestamp.UnixNano(), 10))
		sb.WriteByte(';')
	}
	return sb.String()
}
