package sharing

import (
	"testing"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestDynamicMIGShapes(t *testing.T) {
	dyn := func(profiles ...string) v1.Sharing {
		return v1.Sharing{Strategy: v1.StrategyMIG, MIG: &v1.MIGSharing{
			Instances: []v1.MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}}, Dynamic: &v1.DynamicMIG{Profiles: profiles}}}
	}
	// In force: the fixed 3g.40gb and two instances created for claims.
	applied := &v1.AppliedSharing{Strategy: v1.StrategyMIG, MIGDynamic: &v1.DynamicMIGStatus{Profiles: []string{"1g.10gb"}},
		MIGInstances: []v1.MIGInstanceStatus{{Profile: "3g.40gb"},
			{Profile: "1g.10gb", Claim: &v1.MIGClaimRef{Name: "a"}}, {Profile: "1g.10gb", Claim: &v1.MIGClaimRef{Name: "b"}}}}
	from, _ := AppliedShape(applied)
	for _, tt := range []struct {
		name       string
		to         v1.Sharing
		disruptive bool
	}{
		{"the same policy, with claims' instances on the GPU", dyn("1g.10gb"), false},
		{"another profile allowed", dyn("1g.10gb", "2g.20gb"), false},
		{"a profile no longer allowed", dyn("2g.20gb"), false},
		{"dynamic turned off", v1.Sharing{Strategy: v1.StrategyMIG, MIG: &v1.MIGSharing{Instances: []v1.MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}}}}, true},
		{"another fixed layout", v1.Sharing{Strategy: v1.StrategyMIG, MIG: &v1.MIGSharing{Instances: []v1.MIGInstanceRequest{{Profile: "4g.40gb", Count: 1}}, Dynamic: &v1.DynamicMIG{Profiles: []string{"1g.10gb"}}}}, true},
	} {
		if got := Disruptive(from, ShapeOf(tt.to)); got != tt.disruptive {
			t.Errorf("%s: disruptive %v, want %v", tt.name, got, tt.disruptive)
		}
	}
}
