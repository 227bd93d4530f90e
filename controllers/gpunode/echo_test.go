package gpunode

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

// echoPair is a GPUNode before and after the resolver's spec write (which took it to generation 5), and
// the spec written.
func echoPair() (*v1.GPUNode, *v1.GPUNode, []v1.GPUDesired) {
	before := b.GPUNode("node-a")
	before.Generation = 4
	before.Status.GPUs = []v1.GPUStatus{b.GPU("node-a", 0, b.WithApplied(b.Exclusive(), ""))}
	spec := []v1.GPUDesired{b.Desired("node-a", 0, "p", 1, b.MPS(4, 25))}
	after := before.DeepCopy()
	after.Generation = 5
	after.Spec.GPUs = []v1.GPUDesired{*spec[0].DeepCopy()}
	return before, after, spec
}

func runs(e *echoes, old, cur *v1.GPUNode) bool {
	return e.notEcho().Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur})
}

func TestTheEchoOfTheResolversOwnSpecWriteDoesNotRunTheNodeAgain(t *testing.T) {
	e := newEchoes()
	old, cur, spec := echoPair()
	e.writing("node-a", spec)
	if runs(e, old, cur) {
		t.Fatal("the update event of the resolver's own write re-ran the node")
	}
}

func TestEventsThatAreNotTheResolversOwnWriteRunTheNode(t *testing.T) {
	cases := map[string]func(e *echoes, old, cur *v1.GPUNode, spec []v1.GPUDesired){
		"no write recorded": func(*echoes, *v1.GPUNode, *v1.GPUNode, []v1.GPUDesired) {},
		"someone else's spec edit": func(e *echoes, _, cur *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			cur.Spec.GPUs[0].Sharing = b.MPS(2, 50)
		},
		"someone else's edit removing a GPU": func(e *echoes, _, cur *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			cur.Spec.GPUs = nil
		},
		"status changed in the same event": func(e *echoes, _, cur *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			cur.Status.ObservedGeneration = 5
		},
		"labels changed in the same event": func(e *echoes, _, cur *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			cur.Labels = map[string]string{"x": "y"}
		},
		"deletion began": func(e *echoes, _, cur *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			now := metav1.Now()
			cur.DeletionTimestamp = &now
		},
		"no spec change (a resync)": func(e *echoes, old, cur *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			old.Generation, old.Spec = cur.Generation, cur.Spec
		},
		"the node was forgotten": func(e *echoes, _, _ *v1.GPUNode, spec []v1.GPUDesired) {
			e.writing("node-a", spec)
			e.forget("node-a")
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEchoes()
			old, cur, spec := echoPair()
			setup(e, old, cur, spec)
			if !runs(e, old, cur) {
				t.Error("skipped an event the resolver must act on")
			}
		})
	}
}
