package rightsizing_test

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/test/wait"
)

// An allocation the shim refused at the claim's size (the agent counts it in the claim's status) raises
// the workload's target to at least what the allocation would have brought the claim to, though no pod
// was ever seen over its claim: the refused process held no more than the claim.
func TestAnAllocationRefusedAtTheCapRaisesTheTarget(t *testing.T) {
	ns := namespace(t, "a", nil, nil)
	node := ns + "-node"
	rs := deployment(t, ns, "trainer", "5c7f9d8b6", nil)
	shares := webPods(t, ns, rs, 0, 3, "3Gi")
	publish(t, node, ns, shares...)
	startRightsizer(t)
	wait.For(t, 30*time.Second, func() error {
		r, err := getRec(ns, "deployment-trainer-gpu")
		if err != nil {
			return err
		}
		if q(r.Status.InitialMemory) != "3584Mi" {
			return fmt.Errorf("initial %s, want 3584Mi", q(r.Status.InitialMemory))
		}
		return nil
	}, "a recommendation of 3.5Gi from three pod peaks of 3Gi")

	// A pod of a 10Gi claim, holding 9Gi, is refused an allocation that would have made 14Gi: the sample
	// is 14Gi (above max(10Gi*1.2, 10Gi+256Mi) = 12Gi), so the target rises past 14Gi plus the margin.
	shares[0].used, shares[0].refused, shares[0].demand = "9Gi", 1, "14Gi"
	publish(t, node, ns, shares...)
	wait.For(t, 30*time.Second, func() error {
		r, err := getRec(ns, "deployment-trainer-gpu")
		if err != nil {
			return err
		}
		if r.Status.InitialMemory == nil || r.Status.InitialMemory.Cmp(resource.MustParse("15Gi")) < 0 {
			return fmt.Errorf("initial %s, want at least 15Gi", q(r.Status.InitialMemory))
		}
		return nil
	}, "a refused allocation raises the target to its demand")
}
