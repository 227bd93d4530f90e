package node

import (
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
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
