package gpunode

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

// before and after are a GPUNode around the resolver's spec write that took it to generation 5.
func echoPair() (*v1.GPUNode, *v1.GPUNode) {
	before := b.GPUNode("node-a")
	before.Generation = 4
	before.Status.GPUs = []v1.GPUStatus{b.GPU("node-a", 0, b.WithApplied(b.Exclusive(), ""))}
	after := before.DeepCopy()
	after.Generation = 5
	after.Spec.GPUs = []v1.GPUDesired{b.Desired("node-a", 0, "p", 1, b.MPS(4, 25))}
	return before, after
}

func runs(e *echoes, old, cur *v1.GPUNode) bool {
	return e.notEcho().Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur})
}

func TestTheEchoOfTheResolversOwnSpecWriteDoesNotRunTheNodeAgain(t *testing.T) {
	e := newEchoes()
	old, cur := echoPair()
	e.wrote("node-a", 5)
	if runs(e, old, cur) {
		t.Fatal("the update event of the resolver's own write re-ran the node")
	}
	// Skipped once: a later event reaching the same generation (a resync) runs as usual.
	if !runs(e, old, cur) {
		t.Error("the echo was remembered after it was skipped")
	}
}

func TestEventsThatAreNotTheResolversOwnWriteRunTheNode(t *testing.T) {
	cases := map[string]func(e *echoes, old, cur *v1.GPUNode){
		"no write recorded":                 func(*echoes, *v1.GPUNode, *v1.GPUNode) {},
		"someone else's spec edit after it": func(e *echoes, _, cur *v1.GPUNode) { e.wrote("node-a", 5); cur.Generation = 6 },
		"a write whose result came late":    func(e *echoes, _, _ *v1.GPUNode) { e.wrote("node-a", 4) },
		"status changed in the same event": func(e *echoes, _, cur *v1.GPUNode) {
			e.wrote("node-a", 5)
			cur.Status.ObservedGeneration = 5
		},
		"labels changed in the same event": func(e *echoes, _, cur *v1.GPUNode) {
			e.wrote("node-a", 5)
			cur.Labels = map[string]string{"x": "y"}
		},
		"deletion began": func(e *echoes, _, cur *v1.GPUNode) {
			e.wrote("node-a", 5)
			now := metav1.Now()
			cur.DeletionTimestamp = &now
		},
		"the node was forgotten": func(e *echoes, _, _ *v1.GPUNode) { e.wrote("node-a", 5); e.forget("node-a") },
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEchoes()
			old, cur := echoPair()
			setup(e, old, cur)
			if !runs(e, old, cur) {
				t.Error("skipped an event the resolver must act on")
			}
		})
	}
}
