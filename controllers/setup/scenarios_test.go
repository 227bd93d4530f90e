package setup_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/wait"
)

const settle = 10 * time.Second

func TestTwoPoliciesByLabelConfigureTheirOwnNodes(t *testing.T) {
	x := id(t)
	addNode(t, x+"-1", b.GPUs(x+"-1", 2, b.H100), "pool", x+"-inference")
	addNode(t, x+"-2", b.GPUs(x+"-2", 2, b.H100), "pool", x+"-training")
	addPolicy(t, b.Policy(x+"-mps", b.WithNodeLabels("pool", x+"-inference"), b.WithSharing(b.MPS(4, 25))), x+"-1")
	addPolicy(t, b.Policy(x+"-ts", b.WithNodeLabels("pool", x+"-training"), b.WithSharing(b.TimeSlicing(4, v1.TimeSliceShort))), x+"-2")

	wait.For(t, settle, func() error {
		if err := specIs(x+"-1", map[int32]string{0: x + "-mps/MPS", 1: x + "-mps/MPS"}); err != nil {
			return err
		}
		return specIs(x+"-2", map[int32]string{0: x + "-ts/TimeSlicing", 1: x + "-ts/TimeSlicing"})
	}, "specs written")
	wait.For(t, settle, func() error {
		return conditionIs(x+"-mps", v1.ConditionReady, metav1.ConditionFalse, v1.ReasonApplying, "0 of 2 GPUs applied")
	}, "policies progressing before the agents answer")
	ack(t, x+"-1", x+"-2")
	wait.For(t, settle, func() error {
		if err := readyWith(x+"-mps", 1, 2); err != nil {
			return err
		}
		return readyWith(x+"-ts", 1, 2)
	}, "policies ready")
	if err := conditionIs(x+"-mps", v1.ConditionProgressing, metav1.ConditionFalse, v1.ReasonRolledOut, ""); err != nil {
		t.Error(err)
	}
	wait.For(t, settle, func() error {
		return gaugeIs("gpusharing_policy_gpus", map[string]string{"policy": x + "-mps", "state": "ready"}, 2)
	}, "the policy's GPU gauge counts its ready GPUs")
	wait.For(t, settle, func() error {
		reasons, err := eventReasons(x + "-mps")
		if err != nil {
			return err
		}
		if !slices.Contains(reasons, v1.ReasonAsDesired) {
			return fmt.Errorf("event reasons %v lack %s", reasons, v1.ReasonAsDesired)
		}
		return nil
	}, "an event for the Ready transition")
}

func TestHigherPriorityWinsAnOverlap(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 2, b.H100), "pool", x)
	addPolicy(t, b.Policy(x+"-all", b.WithPriority(1), b.WithNodeLabels("pool", x), b.WithSharing(b.MPS(2, 0))), x)
	addPolicy(t, b.Policy(x+"-one", b.WithPriority(10), b.WithNodeLabels("pool", x), b.WithIndices(1), b.WithSharing(b.TimeSlicing(2, v1.TimeSliceDefault))), x)

	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{0: x + "-all/MPS", 1: x + "-one/TimeSlicing"})
	}, "GPU 1 goes to the higher priority")
	ack(t, x)
	wait.For(t, settle, func() error {
		if err := readyWith(x+"-all", 1, 1); err != nil {
			return err
		}
		if err := readyWith(x+"-one", 1, 1); err != nil {
			return err
		}
		return conditionIs(x+"-all", v1.ConditionConflicted, metav1.ConditionFalse, v1.ReasonNoConflict, "")
	}, "both ready without conflict")
}

func TestEqualPriorityConflictIsResolvedDeterministicallyAndReportedOnBoth(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 2, b.H100), "pool", x)
	first := addPolicy(t, b.Policy(x+"-zz", b.WithPriority(5), b.WithNodeLabels("pool", x), b.WithSharing(b.MPS(2, 0))), x)
	second := addPolicy(t, b.Policy(x+"-aa", b.WithPriority(5), b.WithNodeLabels("pool", x), b.WithSharing(b.TimeSlicing(2, v1.TimeSliceDefault))), x)
	// The rule: the older policy wins; within the same second (the timestamps' precision), the smaller name.
	winner, strategy := first.Name, "MPS"
	if first.CreationTimestamp.Equal(&second.CreationTimestamp) {
		winner, strategy = second.Name, "TimeSlicing"
	}
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{0: winner + "/" + strategy, 1: winner + "/" + strategy})
	}, "the winner configures both GPUs")
	wait.For(t, settle, func() error {
		if err := conditionIs(first.Name, v1.ConditionConflicted, metav1.ConditionTrue, v1.ReasonEqualPriority,
			fmt.Sprintf("policy %s has the same priority 5 and selects 2 of the same GPUs, which %s wins", second.Name, winner)); err != nil {
			return err
		}
		return conditionIs(second.Name, v1.ConditionConflicted, metav1.ConditionTrue, v1.ReasonEqualPriority,
			fmt.Sprintf("policy %s has the same priority 5 and selects 2 of the same GPUs, which %s wins", first.Name, winner))
	}, "both policies report the conflict")
	wait.For(t, settle, func() error {
		reasons, err := eventReasons(second.Name)
		if err != nil {
			return err
		}
		if !slices.Contains(reasons, v1.ReasonEqualPriority) {
			return fmt.Errorf("event reasons %v lack %s", reasons, v1.ReasonEqualPriority)
		}
		return nil
	}, "a warning event with the condition's reason")
}

func TestRelabellingANodeMovesItsGPUsBetweenPolicies(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 2, b.H100), "pool", x+"-a")
	addPolicy(t, b.Policy(x+"-a", b.WithNodeLabels("pool", x+"-a"), b.WithSharing(b.MPS(2, 0))), x)
	addPolicy(t, b.Policy(x+"-b", b.WithNodeLabels("pool", x+"-b"), b.WithSharing(b.TimeSlicing(2, v1.TimeSliceDefault))), x)
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{0: x + "-a/MPS", 1: x + "-a/MPS"})
	}, "policy a configures the node")
	ack(t, x)
	wait.For(t, settle, func() error { return readyWith(x+"-a", 1, 2) }, "policy a ready")

	node := b.Node(x)
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: x}, node); err != nil {
		t.Fatal(err)
	}
	node.Labels["pool"] = x + "-b"
	if err := k8s.Update(context.Background(), node); err != nil {
		t.Fatalf("relabelling: %v", err)
	}
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{0: x + "-b/TimeSlicing", 1: x + "-b/TimeSlicing"})
	}, "policy b takes the node")
	ack(t, x)
	wait.For(t, settle, func() error {
		if err := readyWith(x+"-b", 1, 2); err != nil {
			return err
		}
		return conditionIs(x+"-a", v1.ConditionReady, metav1.ConditionFalse, v1.ReasonNoMatchingGPUs, "")
	}, "b ready, a matches nothing")
}

func TestGPUSelectorsByProductAndIndexAndInventoryChanges(t *testing.T) {
	x := id(t)
	gpus := []v1.GPUStatus{
		b.GPU(x, 0, b.WithProduct(b.H100)),
		b.GPU(x, 1, b.WithProduct(b.A100)),
		b.GPU(x, 2, b.WithProduct(b.H100)),
	}
	addNode(t, x, gpus, "pool", x)
	addPolicy(t, b.Policy(x+"-a100", b.WithNodeLabels("pool", x), b.WithProducts(b.A100), b.WithSharing(b.MPS(2, 0))), x)
	addPolicy(t, b.Policy(x+"-idx2", b.WithNodeLabels("pool", x), b.WithIndices(2), b.WithSharing(b.TimeSlicing(2, v1.TimeSliceDefault))), x)
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{1: x + "-a100/MPS", 2: x + "-idx2/TimeSlicing"})
	}, "each GPU goes to the policy selecting it, GPU 0 stays unlisted")

	// The agent reports one more A100 and loses GPU 2.
	gn, err := getGPUNode(x)
	if err != nil {
		t.Fatal(err)
	}
	gn.Status.GPUs = []v1.GPUStatus{gpus[0], gpus[1], b.GPU(x, 3, b.WithProduct(b.A100))}
	if err := k8s.Status().Update(context.Background(), gn); err != nil {
		t.Fatalf("updating inventory: %v", err)
	}
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{1: x + "-a100/MPS", 3: x + "-a100/MPS"})
	}, "the new GPU is configured and the lost one dropped")
	ack(t, x)
	wait.For(t, settle, func() error {
		if err := readyWith(x+"-a100", 1, 2); err != nil {
			return err
		}
		return conditionIs(x+"-idx2", v1.ConditionReady, metav1.ConditionFalse, v1.ReasonNoMatchingGPUs, "")
	}, "the index policy now matches nothing")
}

func TestAGPUNodeWithoutInventoryGetsNoSpecUntilItHasOne(t *testing.T) {
	x := id(t)
	addNode(t, x+"-empty", nil, "pool", x)
	addNode(t, x+"-control", b.GPUs(x+"-control", 1, b.H100), "pool", x)
	addPolicy(t, b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.MPS(2, 0))), x+"-empty", x+"-control")
	wait.For(t, settle, func() error {
		return specIs(x+"-control", map[int32]string{0: x + "/MPS"})
	}, "the node with inventory is configured")
	// The control node's spec proves the policy was resolved; the empty node must have none.
	if err := specIs(x+"-empty", map[int32]string{}); err != nil {
		t.Fatal(err)
	}
	// The control node's change is disruptive and holds the rollout budget until its agent answers.
	ack(t, x+"-control")
	gn, err := getGPUNode(x + "-empty")
	if err != nil {
		t.Fatal(err)
	}
	gn.Status.GPUs = b.GPUs(x+"-empty", 1, b.H100)
	if err := k8s.Status().Update(context.Background(), gn); err != nil {
		t.Fatal(err)
	}
	wait.For(t, settle, func() error {
		return specIs(x+"-empty", map[int32]string{0: x + "/MPS"})
	}, "the node is configured once its agent publishes inventory")
}

func TestDeletingANodeDeletesItsGPUNode(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 2, b.H100), "pool", x)
	addPolicy(t, b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.MPS(2, 0))), x)
	wait.For(t, settle, func() error { return specIs(x, map[int32]string{0: x + "/MPS", 1: x + "/MPS"}) }, "configured")
	if err := k8s.Delete(context.Background(), b.Node(x)); err != nil {
		t.Fatal(err)
	}
	wait.For(t, settle, func() error {
		if _, err := getGPUNode(x); err == nil {
			return fmt.Errorf("GPUNode %s still exists", x)
		} else if !isNotFound(err) {
			return err
		}
		return nil
	}, "GPUNode deleted")
	wait.For(t, settle, func() error {
		return conditionIs(x, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonNoMatchingGPUs, "")
	}, "the policy no longer counts the node")
}

func TestDeletingAPolicyRestoresTheDefaultBeforeTheObjectGoes(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 2, b.H100), "pool", x)
	p := addPolicy(t, b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.MIG("3g.40gb", 2))), x)
	wait.For(t, settle, func() error { return specIs(x, map[int32]string{0: x + "/MIG", 1: x + "/MIG"}) }, "configured")
	ack(t, x)
	wait.For(t, settle, func() error { return readyWith(x, 1, 2) }, "ready")

	if err := k8s.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{0: "/Exclusive", 1: "/Exclusive"})
	}, "the GPUs are given the default")
	// The agent has not answered: the policy must still be there, saying why.
	wait.For(t, settle, func() error {
		return conditionIs(x, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonRestoringDefault, "2 GPUs do not yet run the default")
	}, "the policy waits for the agent")
	ack(t, x)
	wait.For(t, settle, func() error {
		if _, err := getPolicy(x); !isNotFound(err) {
			return fmt.Errorf("policy still there (%v)", err)
		}
		return nil
	}, "the policy is gone once the agent applied the default")
	gn, err := getGPUNode(x)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gn.Status.GPUs {
		if g.Applied == nil || g.Applied.Strategy != v1.StrategyExclusive {
			t.Errorf("GPU %d runs %v after the policy went, want Exclusive", g.Index, g.Applied)
		}
	}
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{})
	}, "the applied default is unlisted again, the GPUs left as found")
}

func TestDeletingAPolicyDoesNotWaitForeverForASilentAgent(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 1, b.H100), "pool", x)
	p := b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.MPS(2, 0)))
	if err := k8s.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	wait.For(t, settle, func() error { return specIs(x, map[int32]string{0: x + "/MPS"}) }, "configured")
	ack(t, x)
	wait.For(t, settle, func() error { return readyWith(x, 1, 1) }, "ready")
	start := time.Now()
	if err := k8s.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	wait.For(t, restoreTimeout+settle, func() error {
		if _, err := getPolicy(x); !isNotFound(err) {
			return fmt.Errorf("policy still there (%v)", err)
		}
		return nil
	}, "the policy is released after the bound")
	if took := time.Since(start); took < restoreTimeout-time.Second {
		t.Errorf("released after %s, before the %s bound, though the agent never answered", took, restoreTimeout)
	}
	if err := specIs(x, map[int32]string{0: "/Exclusive"}); err != nil {
		t.Errorf("the default must stay in spec for the agent to apply later: %v", err)
	}
}

func TestAHardwareRejectionSurfacesAsDegradedNamingNodeAndGPU(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 3, b.H100), "pool", x)
	addPolicy(t, b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.MIG("3g.40gb", 2))), x)
	wait.For(t, settle, func() error {
		return specIs(x, map[int32]string{0: x + "/MIG", 1: x + "/MIG", 2: x + "/MIG"})
	}, "configured")
	const why = "layout 3x3g.40gb does not fit NVIDIA H100 80GB HBM3"
	failures := map[string]agentsim.Failure{b.UUID(x, 2): {Reason: v1.ReasonLayoutDoesNotFit, Message: why}}
	if err := agentsim.Ack(context.Background(), k8s, x, failures); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("node %s GPU 2: %s", x, why)
	wait.For(t, settle, func() error {
		if err := conditionIs(x, v1.ConditionDegraded, metav1.ConditionTrue, v1.ReasonHardwareRejected, want); err != nil {
			return err
		}
		return conditionIs(x, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonHardwareRejected, "2 of 3 GPUs applied; "+want)
	}, "Degraded names the node and GPU in the agent's words")
}

func TestNonDisruptiveChangesReachEveryNodeAtOnce(t *testing.T) {
	x := id(t)
	var nodes []string
	for i := range 3 {
		n := fmt.Sprintf("%s-%d", x, i)
		nodes = append(nodes, n)
		addNode(t, n, b.GPUs(n, 1, b.H100), "pool", x)
	}
	p := addPolicy(t, b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.MPS(4, 25)),
		b.WithMaxUnavailable(intstr.FromInt32(1))), nodes...)
	// Reaching MPS from the as-found state is disruptive: one node at a time, each acked in turn.
	wait.For(t, 3*settle, func() error {
		ack(t, nodes...)
		return readyWith(x, 3, 3)
	}, "rolled out")
	p, err := getPolicy(p.Name)
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Sharing = b.MPS(4, 50)
	if err := k8s.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	// Without any ack, every node must receive the new percentage.
	wait.For(t, settle, func() error {
		for _, n := range nodes {
			gn, err := getGPUNode(n)
			if err != nil {
				return err
			}
			if len(gn.Spec.GPUs) != 1 || *gn.Spec.GPUs[0].Sharing.MPS.ActiveThreadPercentage != 50 {
				return fmt.Errorf("node %s spec %+v lacks the new percentage", n, gn.Spec.GPUs)
			}
		}
		return nil
	}, "every node has the new setting before any agent answers")
}

// gaugeIs checks a gauge on controller-runtime's metrics registry, where the manager registers its own.
func gaugeIs(name string, labels map[string]string, want float64) error {
	families, err := metrics.Registry.Gather()
	if err != nil {
		return err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := true
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					match = false
				}
			}
			if match {
				if got := m.GetGauge().GetValue(); got != want {
					return fmt.Errorf("%s%v = %v, want %v", name, labels, got, want)
				}
				return nil
			}
		}
	}
	return fmt.Errorf("%s%v not registered", name, labels)
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// The resolver skips the update event of its own spec write (controllers/gpunode/echo.go); someone else's
// edit of the spec, right after that write, must still be put back.
func TestASpecEditByAnyoneElseIsPutBack(t *testing.T) {
	x := id(t)
	addNode(t, x, b.GPUs(x, 2, b.H100), "pool", x)
	addPolicy(t, b.Policy(x, b.WithNodeLabels("pool", x), b.WithSharing(b.TimeSlicing(4, v1.TimeSliceShort))), x)
	want := map[int32]string{0: x + "/TimeSlicing", 1: x + "/TimeSlicing"}
	wait.For(t, settle, func() error { return specIs(x, want) }, "spec written")
	for round := range 3 {
		gn, err := getGPUNode(x)
		if err != nil {
			t.Fatal(err)
		}
		gn.Spec.GPUs = gn.Spec.GPUs[:1]
		gn.Spec.GPUs[0].Sharing = b.MPS(2, 50)
		if err := k8s.Update(context.Background(), gn); err != nil {
			t.Fatal(err)
		}
		wait.For(t, settle, func() error { return specIs(x, want) }, "edit %d put back", round)
	}
}
