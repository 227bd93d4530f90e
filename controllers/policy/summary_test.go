package policy_test

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/policy"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

func view(gn *v1.GPUNode, kv ...string) policy.NodeView {
	return policy.NodeView{GPUNode: gn, Labels: b.Node(gn.Name, kv...).Labels}
}

func TestSummarize(t *testing.T) {
	mig := b.MIG("3g.40gb", 2)
	p := b.Policy("mig", b.WithNodeLabels("pool", "x"), b.WithSharing(mig))
	rival := b.Policy("rival", b.WithNodeLabels("pool", "x"), b.WithIndices(1), b.WithSharing(b.MPS(2, 0)))
	nodes := []policy.NodeView{
		// applied on both GPUs
		view(b.GPUNode("n1", b.WithObserved(1, 1),
			b.WithSpec(b.Desired("n1", 0, "mig", 1, mig), b.Desired("n1", 1, "mig", 1, mig)),
			b.WithGPUs(b.GPU("n1", 0, b.WithApplied(mig, "mig")), b.GPU("n1", 1, b.WithApplied(mig, "mig")))), "pool", "x"),
		// written, GPU 0 applying (in flight), GPU 1 rejected
		view(b.GPUNode("n2", b.WithObserved(1, 1),
			b.WithSpec(b.Desired("n2", 0, "mig", 1, mig), b.Desired("n2", 1, "mig", 1, mig)),
			b.WithGPUs(b.GPU("n2", 0, b.WithApplied(b.Exclusive(), "")),
				b.GPU("n2", 1, b.WithCondition(v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonLayoutDoesNotFit, "no room")))), "pool", "x"),
		// not written yet: waits for the rollout
		view(b.GPUNode("n3", b.WithGPUs(b.GPU("n3", 0, b.WithApplied(b.Exclusive(), "")), b.GPU("n3", 1, b.WithApplied(b.Exclusive(), "")))), "pool", "x"),
		// not selected
		view(b.GPUNode("n4", b.WithGPUs(b.GPU("n4", 0))), "pool", "y"),
		// no inventory yet
		view(b.GPUNode("n5"), "pool", "x"),
	}
	got := policy.Summarize(p, resolve.Compile([]*v1.GPUSharingPolicy{p, rival}), nodes)
	want := policy.Summary{
		MatchedNodes: 3, MatchedGPUs: 6, ReadyGPUs: 2,
		// n1, n2, n3 and n5 (no inventory yet) carry pool=x: the base of a percentage budget.
		SelectedNodes: 4,
		WaitingNodes:  []string{"n3"}, WaitingCount: 1,
		InFlightNodes: []string{"n2"}, InFlightCount: 1,
		Applying: []policy.GPURef{{Node: "n2", Index: 0}}, ApplyingCount: 1,
		Failures:     []policy.Failure{{GPURef: policy.GPURef{Node: "n2", Index: 1}, Reason: v1.ReasonLayoutDoesNotFit, Message: "no room"}},
		FailureCount: 1,
		Conflicts:    []policy.Conflict{{Other: "rival", GPUs: 3, Winner: "mig"}},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("Summarize =\n%+v\nwant\n%+v", got, want)
	}
}

func TestStillConfiguredFindsSpecEntriesAndUnconfirmedGPUs(t *testing.T) {
	nodes := []policy.NodeView{
		// spec still names the policy
		view(b.GPUNode("n1", b.WithSpec(b.Desired("n1", 0, "gone", 1, b.MPS(2, 0))), b.WithGPUs(b.GPU("n1", 0, b.WithApplied(b.MPS(2, 0), "gone"))))),
		// default written, agent has not applied it
		view(b.GPUNode("n2", b.WithSpec(b.Desired("n2", 0, "", 0, resolve.DefaultSharing())), b.WithGPUs(b.GPU("n2", 0, b.WithApplied(b.MPS(2, 0), "gone"))))),
		// default applied
		view(b.GPUNode("n3", b.WithSpec(b.Desired("n3", 0, "", 0, resolve.DefaultSharing())), b.WithGPUs(b.GPU("n3", 0, b.WithApplied(resolve.DefaultSharing(), ""))))),
	}
	got := policy.StillConfigured("gone", nodes)
	want := []policy.GPURef{{Node: "n1", Index: 0}, {Node: "n2", Index: 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("StillConfigured = %v, want %v", got, want)
	}
}
