package node

import (
	"fmt"
	"testing"

	"context"
	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// A sized GPU offers claims what processes can allocate: NVML's total less the driver's reserve
// (GetMemoryInfo_v2), and on MPS less the MPS server's own memory; the GPU's memory in status stays
// NVML's total.
func TestASizedGPUOffersItsMemoryLessTheDriverReserveAndTheMPSServer(t *testing.T) {
	srv := nvmlmock.NewH100(1)
	srv.GPUs[0].SetMemoryReserved(500 << 20)
	inv, err := gpu.NewNVML(srv).Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dev := inv.Devices[0]
	if dev.MemoryReservedBytes != 500<<20 {
		t.Fatalf("reserve read through NVML: %d, want 500Mi", dev.MemoryReservedBytes)
	}
	const mpsServer = 100 << 20
	for _, tt := range []struct {
		strategy v1alpha1.Strategy
		want     int64
	}{
		{v1alpha1.StrategyMPS, int64(dev.MemoryBytes) - 600<<20},
		{v1alpha1.StrategyTimeSlicing, int64(dev.MemoryBytes) - 500<<20},
	} {
		if got := sizedCapacity(dev, &v1alpha1.AppliedSharing{Strategy: tt.strategy}, mpsServer); got != tt.want {
			t.Errorf("%s: offers %d, want %d", tt.strategy, got, tt.want)
		}
	}
	r := &Reconciler{MPSServerMemory: mpsServer}
	gpus := []v1alpha1.GPUStatus{{UUID: dev.UUID, Memory: resource.NewQuantity(int64(dev.MemoryBytes), resource.BinarySI),
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}}}}
	r.setSizedClaims(&scope{inventory: inv}, gpus, nil)
	if c := gpus[0].Sized.MemoryCapacity; c == nil || c.Value() != int64(dev.MemoryBytes)-600<<20 {
		t.Errorf("status.gpus[].sized.memoryCapacity %v, want the total less 600Mi", c)
	}
	if gpus[0].Memory.Value() != int64(dev.MemoryBytes) {
		t.Errorf("status.gpus[].memory %v changed", gpus[0].Memory)
	}
}
