package guard

import (
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
)

// JudgeClaims gives a checker outside the agent the guard's verdict: the group over its claims with its
// pods and the culprits the guard would evict (the pod past the claims that list it), and nothing for a
// group within its claims.
func TestJudgeClaimsNamesTheGroupsOverTheirClaimsAndTheirCulprits(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "ml", Name: "shared", Pods: []string{"a", "b"}, GPU: "GPU-0", MemoryBytes: 4 << 30},
		{Namespace: "ml", Name: "own", Pods: []string{"a"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "c", Pods: []string{"c"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
	}
	got := JudgeClaims(claims, usageOf(ctr("a", 3<<30, 1), ctr("b", 5<<30, 2), ctr("c", 2<<30, 3)))
	want := []ClaimVerdict{{Pods: []string{"ml/a", "ml/b"}, Culprits: []string{"ml/b"}, Used: 8 << 30, Claimed: 6 << 30}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("verdicts %+v, want %+v", got, want)
	}
}
