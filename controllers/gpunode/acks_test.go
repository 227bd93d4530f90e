package gpunode

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

// ackPair is a node of two GPUs with policy p's spec written, before and after the agent acks it.
func ackPair() (*v1.GPUNode, *v1.GPUNode) {
	before := b.GPUNode("node-a")
	before.Generation = 5
	before.Status.GPUs = []v1.GPUStatus{
		b.GPU("node-a", 0, b.WithApplied(b.Exclusive(), "")),
		b.GPU("node-a", 1, b.WithApplied(b.Exclusive(), "")),
	}
	before.Spec.GPUs = []v1.GPUDesired{b.Desired("node-a", 0, "p", 1, b.MPS(4, 25)), b.Desired("node-a", 1, "p", 1, b.MPS(4, 25))}
	before.ResourceVersion = "10"
	after := before.DeepCopy()
	agentsim.Apply(after, nil)
	after.ResourceVersion = "11"
	return before, after
}

func resolverRuns(r *Reconciler, old, cur *v1.GPUNode) bool {
	return r.notPlainAck().Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur})
}

func TestAPlainAckDoesNotRunTheNode(t *testing.T) {
	r := &Reconciler{rollout: newRollout(nil)}
	old, cur := ackPair()
	if resolverRuns(r, old, cur) {
		t.Fatal("the agent's ack of the spec in place re-ran the node")
	}
}

func TestStatusChangesTheResolverActsOnRunTheNode(t *testing.T) {
	cases := map[string]func(r *Reconciler, cur *v1.GPUNode){
		"a GPU's product changed (policies select on it)": func(_ *Reconciler, cur *v1.GPUNode) {
			cur.Status.GPUs[1].Product = "NVIDIA A100"
		},
		"a GPU's memory changed": func(_ *Reconciler, cur *v1.GPUNode) {
			m := resource.MustParse("40Gi")
			cur.Status.GPUs[0].Memory = &m
		},
		"a GPU appeared": func(_ *Reconciler, cur *v1.GPUNode) {
			cur.Status.GPUs = append(cur.Status.GPUs, b.GPU("node-a", 2))
		},
		"a GPU rejected its entry": func(_ *Reconciler, cur *v1.GPUNode) {
			b.SetCondition(&cur.Status.GPUs[1], v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonLayoutDoesNotFit, "no")
		},
		"only one of two GPUs applied so far": func(_ *Reconciler, cur *v1.GPUNode) {
			cur.Status.GPUs[1].Applied = b.AppliedFor(b.Exclusive(), "")
		},
		"an entry returning to the default was acked (the resolver drops it)": func(_ *Reconciler, cur *v1.GPUNode) {
			cur.Spec.GPUs[1].Policy = ""
		},
		"the node waits for a rollout slot": func(r *Reconciler, _ *v1.GPUNode) {
			r.rollout.setWaiting("node-a", []string{"q"})
		},
		"the spec changed too":            func(_ *Reconciler, cur *v1.GPUNode) { cur.Generation++ },
		"a resync (same resourceVersion)": func(_ *Reconciler, cur *v1.GPUNode) { cur.ResourceVersion = "10" },
		"labels changed too": func(_ *Reconciler, cur *v1.GPUNode) {
			cur.Labels = map[string]string{"x": "y"}
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			r := &Reconciler{rollout: newRollout(nil)}
			old, cur := ackPair()
			change(r, cur)
			if !resolverRuns(r, old, cur) {
				t.Error("skipped an update the resolver must act on")
			}
		})
	}
}
