package gpunode

import (
	"encoding/json"
	"hash/fnv"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// echoes remembers, per node, the spec the resolver last wrote (as a hash), so that the update event of
// that write does not run the node again. That pass would compute the spec it just wrote from the state
// it just read: the write changed nothing else, and any other change made in between (a status report, a
// label, a policy) has an event of its own. At fleet scale the echo was half of the resolver's
// reconciles, each holding one of the write gate's few slots while it found nothing to do.
//
// The test is the spec's content, not the generation the write produced: under load the event often
// reaches the informer before the write's answer reaches the worker, and someone else's edit of the spec
// has other content, so it still runs the node (and is put back).
type echoes struct {
	mu   sync.Mutex
	spec map[string]uint64
}

func newEchoes() *echoes { return &echoes{spec: map[string]uint64{}} }

// writing records the spec the resolver is about to write to node; call it before the write.
func (e *echoes) writing(node string, spec []v1.GPUDesired) {
	h, ok := specHash(spec)
	e.mu.Lock()
	defer e.mu.Unlock()
	if !ok {
		delete(e.spec, node)
		return
	}
	e.spec[node] = h
}

// forget drops a node that is gone.
func (e *echoes) forget(node string) {
	e.mu.Lock()
	delete(e.spec, node)
	e.mu.Unlock()
}

// isEcho says whether an update only moved the spec, to what the resolver last wrote there.
func (e *echoes) isEcho(old, cur *v1.GPUNode) bool {
	if old.Generation >= cur.Generation ||
		!equality.Semantic.DeepEqual(old.Status, cur.Status) ||
		!equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
		!equality.Semantic.DeepEqual(old.Annotations, cur.Annotations) ||
		!equality.Semantic.DeepEqual(old.Finalizers, cur.Finalizers) ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp) {
		return false
	}
	h, ok := specHash(cur.Spec.GPUs)
	e.mu.Lock()
	want, known := e.spec[cur.Name]
	e.mu.Unlock()
	return ok && known && h == want
}

// specHash is a hash of the spec's JSON: the API server's round trip keeps every field the resolver sets.
func specHash(spec []v1.GPUDesired) (uint64, bool) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return 0, false
	}
	h := fnv.New64a()
	_, _ = h.Write(raw)
	return h.Sum64(), true
}

// notEcho is the predicate for the resolver's own GPUNode events.
func (e *echoes) notEcho() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(ev event.UpdateEvent) bool {
		old, ok1 := ev.ObjectOld.(*v1.GPUNode)
		cur, ok2 := ev.ObjectNew.(*v1.GPUNode)
		return !ok1 || !ok2 || !e.isEcho(old, cur)
	}}
}
