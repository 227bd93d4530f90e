package node

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

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

// A fixed 3g.40gb added on a dynamic H100 whose claims hold 0-1 (2g.20gb, claim a) and 6 (1g.10gb,
// claim b) fits around neither claim: the drain takes claim a alone (its slices are the first that
// suffice), names it and why in the drain status, and leaves claim b's pod out of the drain.
func TestAFixedLayoutChangeDrainsOnlyTheClaimWhoseSlicesItNeeds(t *testing.T) {
	inv, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	dev := inv.Devices[0]
	dev.MIGMode = gpu.MIGMode{Current: true, Pending: true}
	inForce := &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG, MIGDynamic: &v1alpha1.DynamicMIGStatus{Profiles: []string{"1g.10gb", "2g.20gb"}},
		MIGInstances: []v1alpha1.MIGInstanceStatus{
			{Profile: "2g.20gb", Placement: v1alpha1.MIGPlacement{Start: 0, Size: 2}, UUID: "MIG-a", GPUInstanceID: 5,
				Claim: &v1alpha1.MIGClaimRef{Namespace: "ns", Name: "a", UID: "uid-a", Pods: []string{"pod-a"}}},
			{Profile: "1g.10gb", Placement: v1alpha1.MIGPlacement{Start: 6, Size: 1}, UUID: "MIG-b", GPUInstanceID: 9,
				Claim: &v1alpha1.MIGClaimRef{Namespace: "ns", Name: "b", UID: "uid-b", Pods: []string{"pod-b"}}},
		}}
	from, _ := sharing.AppliedShape(inForce)
	want := v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{
		Instances: []v1alpha1.MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}}, Dynamic: &v1alpha1.DynamicMIG{Profiles: []string{"1g.10gb", "2g.20gb"}}}}
	change, ok := layoutChange(dev, inForce, from, sharing.ShapeOf(want), want)
	if !ok || change.Empty() {
		t.Fatalf("change %+v ok %v; want one that takes a claim", change, ok)
	}
	sc := scopeOf(dev.Index, change)
	if !reflect.DeepEqual(sc.migs, []string{"MIG-a"}) || !reflect.DeepEqual(sc.claims.Claims, []types.UID{"uid-a"}) || len(sc.claims.Devices) != 0 {
		t.Errorf("scope %+v; want claim a and its instance alone", sc)
	}
	// The drain that starts carries the scope into the status.
	s, acts := next(drainState{}, observation{kind: obsPass, want: drainTarget{key: "k", target: "MIG 3g.40gb x1", scope: sc}, disruptive: true, admitted: true})
	s, acts2 := next(s, observation{kind: obsPass, want: drainTarget{key: "k", target: "MIG 3g.40gb x1", scope: sc}, disruptive: true, admitted: true})
	if !reflect.DeepEqual(append(acts, acts2...), []drainAction{actCordon, actStartDrain}) {
		t.Fatalf("actions %v; want cordon, then start the drain", append(acts, acts2...))
	}
	st := drainStatus(s, v1alpha1.DrainPhaseDraining)
	for _, w := range []string{"drains only claim ns/a (2g.20gb at 0-1): the new fixed 3g.40gb at 0-3 needs its slices"} {
		if !strings.Contains(st.Message, w) {
			t.Errorf("drain message %q lacks %q", st.Message, w)
		}
	}
	if strings.Contains(st.Message, "ns/b") {
		t.Errorf("drain message %q names claim b, which stays", st.Message)
	}
	if err := drainingError(s.view); !strings.Contains(err.Error(), "its other claims keep running") {
		t.Errorf("Draining condition %q", err)
	}
}
