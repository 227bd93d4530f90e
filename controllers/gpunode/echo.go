package gpunode

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// echoes remembers, per node, the generation the resolver's own last spec write produced, so that the
// update event of that write does not run the node again. That pass would compute the spec it just wrote
// from the state it just read: the write changed nothing else, and any other change made in between
// (a status report, a label, a policy) has an event of its own. At fleet scale the echo was half of the
// resolver's reconciles, each holding one of the write gate's few slots while it found nothing to do.
type echoes struct {
	mu  sync.Mutex
	gen map[string]int64
}

func newEchoes() *echoes { return &echoes{gen: map[string]int64{}} }

// wrote records that the resolver's write left node at generation gen.
func (e *echoes) wrote(node string, gen int64) {
	e.mu.Lock()
	e.gen[node] = gen
	e.mu.Unlock()
}

// forget drops a node that is gone.
func (e *echoes) forget(node string) {
	e.mu.Lock()
	delete(e.gen, node)
	e.mu.Unlock()
}

// isEcho says whether an update is exactly the resolver's own last write to the node: the generation
// moved to the one that write produced, and nothing but the spec changed. Anyone else's spec edit has
// another generation (the resolver must put it back), and an event that also carries a status or
// metadata change is not skipped.
func (e *echoes) isEcho(old, cur *v1.GPUNode) bool {
	e.mu.Lock()
	gen, ok := e.gen[cur.Name]
	e.mu.Unlock()
	if !ok || cur.Generation != gen || old.Generation >= cur.Generation {
		return false
	}
	if !equality.Semantic.DeepEqual(old.Status, cur.Status) ||
		!equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
		!equality.Semantic.DeepEqual(old.Annotations, cur.Annotations) ||
		!equality.Semantic.DeepEqual(old.Finalizers, cur.Finalizers) ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp) {
		return false
	}
	e.forget(cur.Name)
	return true
}

// notEcho is the predicate for the resolver's own GPUNode events.
func (e *echoes) notEcho() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(ev event.UpdateEvent) bool {
		old, ok1 := ev.ObjectOld.(*v1.GPUNode)
		cur, ok2 := ev.ObjectNew.(*v1.GPUNode)
		return !ok1 || !ok2 || !e.isEcho(old, cur)
	}}
}
