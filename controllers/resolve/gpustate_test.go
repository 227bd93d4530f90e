package resolve_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

func TestStateOfAndInFlight(t *testing.T) {
	mig := b.MIG("3g.40gb", 2)
	mps := b.MPS(4, 0)
	tests := []struct {
		name         string
		node         *v1.GPUNode
		wantPhase    resolve.Phase
		wantReason   string
		wantInFlight []string
	}{
		{
			name: "a disruptive change not yet applied is in flight",
			node: b.GPUNode("n", b.WithObserved(2, 1),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(b.Exclusive(), "")))),
			wantPhase: resolve.PhaseApplying, wantInFlight: []string{"p"},
		},
		{
			name: "an applied change is done",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(mig, "p")))),
			wantPhase: resolve.PhaseApplied,
		},
		{
			name: "a non-disruptive change not yet applied is not in flight",
			node: b.GPUNode("n", b.WithObserved(2, 1),
				b.WithSpec(b.Desired("n", 0, "p", 2, b.MPS(4, 50))),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(mps, "p")))),
			wantPhase: resolve.PhaseApplying,
		},
		{
			name: "a hardware rejection of the current spec ends the flight and names the cause",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithCondition(v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonLayoutDoesNotFit, "does not fit")))),
			wantPhase: resolve.PhaseFailed, wantReason: v1.ReasonLayoutDoesNotFit,
		},
		{
			name: "a rejection reported before the agent saw the spec is stale",
			node: b.GPUNode("n", b.WithObserved(3, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithCondition(v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonLayoutDoesNotFit, "does not fit")))),
			wantPhase: resolve.PhaseApplying, wantInFlight: []string{"p"},
		},
		{
			name: "a busy GPU is still in flight, it is draining",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithCondition(v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonGPUBusy, "pids 7")))),
			wantPhase: resolve.PhaseApplying, wantInFlight: []string{"p"},
		},
		{
			name: "a drain in progress is still in flight",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithCondition(v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonDraining, "waiting for pod a/b")))),
			wantPhase: resolve.PhaseApplying, wantInFlight: []string{"p"},
		},
		{
			name: "a drain that timed out has failed and names the cause",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithCondition(v1.ConditionApplied, metav1.ConditionFalse, v1.ReasonDrainTimedOut, "pod a/b still runs")))),
			wantPhase: resolve.PhaseFailed, wantReason: v1.ReasonDrainTimedOut,
		},
		{
			name: "an unhealthy GPU has failed even when applied",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 0, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(mig, "p"), b.WithCondition(v1.ConditionHealthy, metav1.ConditionFalse, "XidError", "Xid 79: fallen off the bus")))),
			wantPhase: resolve.PhaseFailed, wantReason: "XidError",
		},
		{
			name: "an entry whose GPU the agent no longer reports is gone",
			node: b.GPUNode("n", b.WithObserved(2, 2),
				b.WithSpec(b.Desired("n", 5, "p", 1, mig)),
				b.WithGPUs(b.GPU("n", 0))),
			wantPhase: resolve.PhaseGone,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := resolve.StateOf(tt.node, &tt.node.Spec.GPUs[0])
			if st.Phase != tt.wantPhase || st.Reason != tt.wantReason {
				t.Errorf("StateOf = %+v, want phase %d reason %q", st, tt.wantPhase, tt.wantReason)
			}
			if got := resolve.InFlightPolicies(tt.node); !equal(got, tt.wantInFlight) {
				t.Errorf("InFlightPolicies = %v, want %v", got, tt.wantInFlight)
			}
		})
	}
}
