package guard

import (
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/accounting"
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

// A group over its claims where no pod alone is past the claims that list it, on a shim GPU: the pod
// whose process is no shim client (it dropped the shim) holds memory outside the ledgers that keep the
// others within the claims, and is the one culprit. Where no process is a shim client (an MPS GPU), no
// pod can be told apart that way, and the group's pods are.
func TestAGroupOverItsClaimsThroughAProcessOutsideTheShimBlamesItsPod(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "ml", Name: "shared", Pods: []string{"a", "b"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "own-a", Pods: []string{"a"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "own-b", Pods: []string{"b"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
	}
	// 3 + 3.5 GiB of the 6 the group claims; each within its own 4.
	acct := usageOf(ctr("a", 3<<30, 1), ctr("b", 7<<29, 2))
	want := ClaimVerdict{Pods: []string{"ml/a", "ml/b"}, Culprits: []string{"ml/a", "ml/b"}, Used: 13 << 29, Claimed: 6 << 30}
	if got := JudgeClaims(claims, acct); !reflect.DeepEqual(got, []ClaimVerdict{want}) {
		t.Errorf("no shim clients: verdicts %+v, want %+v", got, want)
	}
	acct.Processes[1].Shim = &accounting.ShimUsage{} // b's process is a shim client, a's is not
	want.Culprits = []string{"ml/a"}
	if got := JudgeClaims(claims, acct); !reflect.DeepEqual(got, []ClaimVerdict{want}) {
		t.Errorf("a's process outside the shim: verdicts %+v, want %+v", got, want)
	}
}
