package node

import (
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestDynamicMIGRefusesAProfileTheGPUDoesNotOffer(t *testing.T) {
	inv, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	dev := inv.Devices[0]
	err = checkDynamicMIG(dev, v1alpha1.MIGSharing{Dynamic: &v1alpha1.DynamicMIG{Profiles: []string{"1g.10gb", "3g.20gb"}}})
	if reason, _ := reasonFor(err); reason != v1alpha1.ReasonLayoutDoesNotFit || !strings.Contains(err.Error(), "mig.dynamic profile 3g.20gb is not offered by this GPU") {
		t.Errorf("check = %v (reason %s)", err, reason)
	}
	if err := checkDynamicMIG(dev, v1alpha1.MIGSharing{Dynamic: &v1alpha1.DynamicMIG{Profiles: []string{"1g.10gb", "7g.80gb"}}}); err != nil {
		t.Errorf("offered profiles refused: %v", err)
	}
}

func TestADynamicGPUsStatusNamesTheClaimsAndWhatIsFree(t *testing.T) {
	gpus := []v1alpha1.GPUStatus{{Index: 0, UUID: "GPU-a",
		MIGProfiles: []v1alpha1.MIGProfile{{Name: "1g.10gb", SliceCount: 1, Placements: []v1alpha1.MIGPlacement{{Start: 6, Size: 1}}},
			{Name: "3g.40gb", SliceCount: 3}, {Name: "7g.80gb", SliceCount: 7, Placements: []v1alpha1.MIGPlacement{{Start: 0, Size: 8}}}},
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG, MIGDynamic: &v1alpha1.DynamicMIGStatus{Profiles: []string{"1g.10gb", "3g.40gb"}},
			MIGInstances: []v1alpha1.MIGInstanceStatus{
				{Profile: "3g.40gb", Placement: v1alpha1.MIGPlacement{Start: 0, Size: 4}, UUID: "MIG-1"},
				{Profile: "1g.10gb", Placement: v1alpha1.MIGPlacement{Start: 6, Size: 1}, UUID: "MIG-2"},
			}}}}
	setMIGClaims(gpus, []dra.MIGRecord{{Claim: "u1", Namespace: "ns", Name: "big", Pods: []string{"p"}, GPU: "GPU-a", Created: true, UUID: "MIG-1",
		Placement: gpu.Placement{Start: 0, Size: 4}}})
	a := gpus[0].Applied
	if c := a.MIGInstances[0].Claim; c == nil || c.Name != "big" || c.UID != "u1" || c.Pods[0] != "p" {
		t.Errorf("the claim's instance lists claim %+v", c)
	}
	if a.MIGInstances[1].Claim != nil {
		t.Errorf("an instance no claim holds lists %+v", a.MIGInstances[1].Claim)
	}
	if a.MIGDynamic.FreeSlices != "4-5,7" || a.MIGDynamic.FreeComputeSlices != 3 {
		t.Errorf("free %q compute %d; want 4-5,7 and 3", a.MIGDynamic.FreeSlices, a.MIGDynamic.FreeComputeSlices)
	}
	if got := migFreeSummary(gpus); got != "0:slices 4-5,7 compute 3" {
		t.Errorf("wide column %q", got)
	}
	if got := Summary(gpus); got != "0:MIG(dyn 3g.40gb,1g.10gb free 4-5,7)" {
		t.Errorf("summary %q", got)
	}
}
