package testenv

import (
	"context"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// UpdateClaimStatus reads the claim, applies change to its status and writes it back, reading again
// on a conflict: once a claim is prepared, the agent applies its devices' status at any time, so a
// test's write of the scheduler's part (reservedFor, allocation) may find the object moved on. It
// leaves the written claim in claim.
func UpdateClaimStatus(t testing.TB, ctx context.Context, c client.Client, claim *resourcev1.ResourceClaim, change func(*resourcev1.ResourceClaim)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
			return err
		}
		change(claim)
		return c.Status().Update(ctx, claim)
	})
	if err != nil {
		t.Fatalf("status of claim %s/%s: %v", claim.Namespace, claim.Name, err)
	}
}
