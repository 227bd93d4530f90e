package node

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A pod is over when its containers together hold more than its claims of the GPU together; a pod on
// the GPU with no claim of it has claimed nothing; a process of no pod is no pod's.
func TestOverClaimsComparesEachPodsMemoryWithItsClaimsOnTheGPU(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "ml", Name: "a1", Pods: []string{"two-claims"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "a2", Pods: []string{"two-claims"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "b", Pods: []string{"over", "shares-b"}, GPU: "GPU-0", MemoryBytes: 4 << 30},
	}
	acct := usageOf(
		ctr("two-claims", 3<<30, 0, 1), ctr("two-claims", 1<<30, 0, 2), // 4 GiB of 4: within
		ctr("over", 3<<30, 0, 3), ctr("over", 2<<30, 0, 4), // 5 GiB of 4
		ctr("shares-b", 4<<30, 0, 5), // a claim shared by two pods counts whole for each, as the alert does
		ctr("no-claim", 1<<20, 0, 6),
		ctr("", 8<<30, 0, 7), // the MPS server, a host process
	)
	var got []string
	for _, o := range overClaims(claims, acct) {
		got = append(got, o.String())
	}
	want := []string{"ml/no-claim holds 1Mi, its claims 0", "ml/over holds 5Gi, its claims 4Gi"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("over their claims: %q, want %q", got, want)
	}
}

type claimList []dra.SizedClaim

func (c claimList) SizedClaims() []dra.SizedClaim { return c }

// WithinClaims belongs to GPUs sized per claim: carried over from the status before, it leaves a GPU no
// longer sized, and every GPU of an agent without the kubelet plugin.
func TestWithinClaimsLeavesAGPUThatIsNoLongerSized(t *testing.T) {
	stale := metav1.Condition{Type: v1alpha1.ConditionWithinClaims, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonClaimExceeded}
	fixed := v1alpha1.GPUStatus{UUID: "GPU-0", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS}, Conditions: []metav1.Condition{stale}}
	for _, r := range []*Reconciler{{Claims: claimList{}}, {}} {
		gpus := []v1alpha1.GPUStatus{*fixed.DeepCopy()}
		r.setSizedClaims(&scope{}, gpus, nil)
		if c := meta.FindStatusCondition(gpus[0].Conditions, v1alpha1.ConditionWithinClaims); c != nil {
			t.Errorf("claims source %v: WithinClaims %+v kept on a GPU with fixed shares", r.Claims != nil, c)
		}
	}
}
