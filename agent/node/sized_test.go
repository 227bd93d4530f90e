package node

import (
	"fmt"
	"testing"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A GPU with more claims than the status lists sums all of them, lists the largest and counts the rest;
// a claim's use is its pods' containers' memory, other pods' not counted.
func TestSizedStatusListsAtMostMaxClaimsLargestFirst(t *testing.T) {
	var claims []dra.SizedClaim
	n := v1alpha1.MaxSizedClaimsInStatus + 3
	for i := range n {
		claims = append(claims, dra.SizedClaim{Namespace: "ml", Name: fmt.Sprintf("c%02d", i), Pods: []string{fmt.Sprintf("p%02d", i)},
			GPU: "GPU-0", MemoryBytes: int64(i+1) << 30, ComputePercent: 1})
	}
	acct := usageOf(ctr(fmt.Sprintf("p%02d", n-1), 2<<30, 10, 1), ctr("p00", 1<<30, 10, 2), ctr("other", 5<<30, 10, 3))
	s := sizedStatus(claims, acct, true, nil)
	var total int64
	for i := range n {
		total += int64(i+1) << 30
	}
	if s.MemoryAllocated.Value() != total || s.ComputeAllocated != int32(n) {
		t.Errorf("allocated %v and %d%%, want %d and %d%%", s.MemoryAllocated, s.ComputeAllocated, total, n)
	}
	if len(s.Claims) != v1alpha1.MaxSizedClaimsInStatus || s.OmittedClaims != 3 {
		t.Fatalf("%d claims listed, %d omitted; want %d and 3", len(s.Claims), s.OmittedClaims, v1alpha1.MaxSizedClaimsInStatus)
	}
	first := s.Claims[0]
	if first.Name != fmt.Sprintf("c%02d", n-1) || first.MemoryUsed == nil || first.MemoryUsed.Value() != 2<<30 {
		t.Errorf("first claim %+v, want the largest using 2Gi", first)
	}
	for _, c := range s.Claims {
		if c.Name == "c00" {
			t.Errorf("the smallest claim is listed: %+v", c)
		}
	}
	if unread := sizedStatus(claims[:1], accounting.GPU{}, false, nil); unread.Claims[0].MemoryUsed != nil {
		t.Errorf("memoryUsed %v where the accounting has not read the GPU", unread.Claims[0].MemoryUsed)
	}
}
