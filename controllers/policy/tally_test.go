package policy

import (
	"context"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

// memCache stands in for the informer cache (Get and List of GPUNodes and Node metadata) and counts the
// GPUNodes each pass reads, which is what the tally exists to bound.
type memCache struct {
	gpuNodes map[string]*v1.GPUNode
	labels   map[string]map[string]string
	gets     int
	lists    int
}

func (m *memCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch o := obj.(type) {
	case *v1.GPUNode:
		m.gets++
		gn, ok := m.gpuNodes[key.Name]
		if !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "gpunodes"}, key.Name)
		}
		gn.DeepCopyInto(o)
	case *metav1.PartialObjectMetadata:
		l, ok := m.labels[key.Name]
		if !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, key.Name)
		}
		o.Name, o.Labels = key.Name, l
	default:
		return fmt.Errorf("memCache: unexpected %T", obj)
	}
	return nil
}

func (m *memCache) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l, ok := list.(*v1.GPUNodeList)
	if !ok {
		return fmt.Errorf("memCache: unexpected %T", list)
	}
	m.lists++
	for _, gn := range m.gpuNodes {
		l.Items = append(l.Items, *gn.DeepCopy())
	}
	return nil
}

func (m *memCache) views() []NodeView {
	var out []NodeView
	for name, gn := range m.gpuNodes {
		if l, ok := m.labels[name]; ok {
			out = append(out, NodeView{GPUNode: gn, Labels: l})
		}
	}
	return out
}

// TestTallyReadsOnlyChangedNodesAndAgreesWithAFullPass rolls a policy out over 50 nodes as agents
// would, a few acks per pass, and checks after every pass that the tally (a) read only the GPUNodes
// marked dirty, and (b) reports exactly what Summarize computes from every node.
func TestTallyReadsOnlyChangedNodesAndAgreesWithAFullPass(t *testing.T) {
	mps := b.MPS(4, 25)
	p := b.Policy("p", b.WithNodeLabels("pool", "x"), b.WithSharing(mps), b.WithGeneration(1))
	rival := b.Policy("rival", b.WithNodeLabels("pool", "x"), b.WithIndices(1), b.WithSharing(b.MPS(2, 0)), b.WithGeneration(1))
	compiled := resolve.Compile([]*v1.GPUSharingPolicy{p, rival})
	m := &memCache{gpuNodes: map[string]*v1.GPUNode{}, labels: map[string]map[string]string{}}
	const n = 50
	name := func(i int) string { return fmt.Sprintf("n%02d", i) }
	for i := range n {
		m.gpuNodes[name(i)] = b.GPUNode(name(i), b.WithGPUs(b.GPU(name(i), 0, b.WithApplied(b.Exclusive(), "")), b.GPU(name(i), 1, b.WithApplied(b.Exclusive(), ""))))
		m.labels[name(i)] = map[string]string{"pool": "x"}
	}
	tally := NewTally()
	ctx := context.Background()
	check := func(step string, wantGets int) {
		t.Helper()
		m.gets, m.lists = 0, 0
		got, err := tally.Summary(ctx, m, compiled, p)
		if err != nil {
			t.Fatal(err)
		}
		if m.gets != wantGets {
			t.Errorf("%s: the pass read %d GPUNodes, want %d", step, m.gets, wantGets)
		}
		want := Summarize(p, compiled, m.views())
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Errorf("%s: tally =\n%+v\nfull pass =\n%+v", step, got, want)
		}
	}
	check("first pass", n)
	check("nothing changed", 0)
	for i := range n {
		// The resolver writes the spec, then the agent acks: two events, one node to re-read.
		gn := m.gpuNodes[name(i)]
		gn.Spec.GPUs = []v1.GPUDesired{b.Desired(gn.Name, 0, "p", 1, mps), b.Desired(gn.Name, 1, "p", 1, mps)}
		tally.MarkDirty(gn.Name)
		tally.MarkDirty(gn.Name)
		if i%3 == 0 {
			check(fmt.Sprintf("written on %d", i), 1)
		}
		if i != 7 {
			gn.Status.GPUs = []v1.GPUStatus{b.GPU(gn.Name, 0, b.WithApplied(mps, "p")), b.GPU(gn.Name, 1, b.WithApplied(mps, "p"))}
		}
		tally.MarkDirty(gn.Name)
		check(fmt.Sprintf("acked on %d", i), 1)
	}
	// A node relabelled out of the pool and a GPUNode deleted: subtracted, not recounted.
	m.labels[name(3)] = map[string]string{"pool": "y"}
	delete(m.gpuNodes, name(4))
	tally.MarkDirty(name(3))
	tally.MarkDirty(name(4))
	check("relabel and delete", 2)
	// A policy change moves GPUs between policies: the next pass reads every GPUNode once.
	p2 := p.DeepCopy()
	p2.Generation = 2
	compiled = resolve.Compile([]*v1.GPUSharingPolicy{p2, rival})
	p = p2
	check("policy changed", n-1)
	if got, _ := tally.Summary(ctx, m, compiled, p); got.ReadyGPUs != 0 || got.ApplyingCount == 0 {
		t.Errorf("after the policy change: %+v, want nothing ready at generation 2", got)
	}
}
