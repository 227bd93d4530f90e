package dra_test

import (
	"reflect"
	"sort"
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// While a fixed 3g.40gb is drained in, taking claim a's 2g.20gb at 0-1, the H100 keeps publishing the
// placements that stay free (4, 5 beside claim b's 1g.10gb at 6); only those that overlap the new
// instance at 0-3 are withheld. A drain of the whole GPU (dynamic turned off) publishes none.
func TestAPartialDrainWithholdsOnlyThePlacementsTheChangeTakes(t *testing.T) {
	profiles := []string{"1g.10gb", "2g.20gb"}
	st := dynamicNode(t, profiles,
		v1alpha1.MIGInstanceStatus{Profile: "2g.20gb", Placement: v1alpha1.MIGPlacement{Start: 0, Size: 2}, UUID: "MIG-a", GPUInstanceID: 5,
			Claim: &v1alpha1.MIGClaimRef{Namespace: "ns", Name: "a", UID: "uid-a"}},
		v1alpha1.MIGInstanceStatus{Profile: "1g.10gb", Placement: v1alpha1.MIGPlacement{Start: 6, Size: 1}, UUID: "MIG-b", GPUInstanceID: 9,
			Claim: &v1alpha1.MIGClaimRef{Namespace: "ns", Name: "b", UID: "uid-b"}})
	g := &st.GPUs[0]
	g.Drain = &v1alpha1.GPUDrainStatus{Phase: v1alpha1.DrainPhaseDraining, Target: "MIG 3g.40gb x1"}
	want := v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{
		Instances: []v1alpha1.MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}}, Dynamic: &v1alpha1.DynamicMIG{Profiles: profiles}}}
	node := &v1alpha1.GPUNode{Spec: v1alpha1.GPUNodeSpec{GPUs: []v1alpha1.GPUDesired{{UUID: g.UUID, Index: 0, Sharing: want}}}, Status: st}
	names := func(node *v1alpha1.GPUNode) []string {
		var out []string
		for _, d := range dra.NodeDevices(node, share.DefaultConfig()) {
			out = append(out, d.Name)
		}
		sort.Strings(out)
		return out
	}
	// Claim b's own placement stays published: its allocation holds its counters.
	wantNames := []string{"gpu-0-mig-1g-10gb-4", "gpu-0-mig-1g-10gb-5", "gpu-0-mig-1g-10gb-6", "gpu-0-mig-2g-20gb-4"}
	if got := names(node); !reflect.DeepEqual(got, wantNames) {
		t.Errorf("published during the partial drain %v, want %v", got, wantNames)
	}
	node.Spec.GPUs[0].Sharing.MIG.Dynamic = nil
	if got := names(node); len(got) != 0 {
		t.Errorf("published while the whole GPU drains: %v", got)
	}
}
