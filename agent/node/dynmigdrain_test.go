package node

import (
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/sharing"
)

// A fixed-layout change on a dynamic H100 drains no pod when the new fixed instances only take free
// slices around the claims' instances; it drains the GPU when they need a claim's slices or a fixed
// instance must go.
func TestAFixedLayoutChangeOnADynamicGPUDrainsOnlyWhenItMust(t *testing.T) {
	inv, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	dev := inv.Devices[0]
	dev.MIGMode = gpu.MIGMode{Current: true, Pending: true}
	// On the GPU: a fixed 1g.10gb at slice 6 and a claim's 2g.20gb at 0-1.
	dev.Instances = []gpu.Instance{
		{ProfileID: 19, Profile: "1g.10gb", Placement: gpu.Placement{Start: 6, Size: 1}, GIID: 9, CIID: 0, UUID: "MIG-fixed"},
		{ProfileID: 14, Profile: "2g.20gb", Placement: gpu.Placement{Start: 0, Size: 2}, GIID: 5, CIID: 0, UUID: "MIG-claim"},
	}
	inForce := &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG, MIGDynamic: &v1alpha1.DynamicMIGStatus{Profiles: []string{"1g.10gb", "2g.20gb"}},
		MIGInstances: []v1alpha1.MIGInstanceStatus{
			{Profile: "1g.10gb", Placement: v1alpha1.MIGPlacement{Start: 6, Size: 1}, UUID: "MIG-fixed"},
			{Profile: "2g.20gb", Placement: v1alpha1.MIGPlacement{Start: 0, Size: 2}, UUID: "MIG-claim", Claim: &v1alpha1.MIGClaimRef{Name: "c"}},
		}}
	from, _ := sharing.AppliedShape(inForce)
	dyn := func(profiles []string, fixed ...v1alpha1.MIGInstanceRequest) v1alpha1.Sharing {
		return v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{Instances: fixed, Dynamic: &v1alpha1.DynamicMIG{Profiles: profiles}}}
	}
	both := []string{"1g.10gb", "2g.20gb"}
	for _, tt := range []struct {
		name  string
		to    v1alpha1.Sharing
		drain bool
	}{
		{"the same layout", dyn(both, v1alpha1.MIGInstanceRequest{Profile: "1g.10gb", Count: 1}), false},
		{"a fixed 2g.20gb added on free slices beside the kept 1g.10gb at 6", dyn(both,
			v1alpha1.MIGInstanceRequest{Profile: "1g.10gb", Count: 1}, v1alpha1.MIGInstanceRequest{Profile: "2g.20gb", Count: 1}), false},
		{"a second fixed 1g.10gb on a free slice", dyn(both, v1alpha1.MIGInstanceRequest{Profile: "1g.10gb", Count: 2}), false},
		{"the fixed 1g.10gb removed", dyn(both), true},
		{"a fixed 3g.40gb that needs slices 4-7, under the fixed 1g.10gb", dyn(both, v1alpha1.MIGInstanceRequest{Profile: "3g.40gb", Count: 1}), true},
		{"fixed instances that need the claim's slices", dyn(both,
			v1alpha1.MIGInstanceRequest{Profile: "1g.10gb", Count: 1}, v1alpha1.MIGInstanceRequest{Profile: "2g.20gb", Count: 3}), true},
		{"dynamic turned off", v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{
			Instances: []v1alpha1.MIGInstanceRequest{{Profile: "1g.10gb", Count: 2}}}}, true},
	} {
		to := sharing.ShapeOf(tt.to)
		if got := sharing.Disruptive(from, to) && !layoutFitsAroundClaims(dev, inForce, from, to, tt.to); got != tt.drain {
			t.Errorf("%s: drains %v, want %v", tt.name, got, tt.drain)
		}
	}
}
