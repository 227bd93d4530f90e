package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestSharingHashTellsSharingsApart(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	pct := func(v int32) *int32 { return &v }
	mps := func(r int32, p *int32, l *resource.Quantity) Sharing {
		return Sharing{Strategy: StrategyMPS, MPS: &MPSSharing{Replicas: r, ActiveThreadPercentage: p, PinnedMemoryLimit: l}}
	}
	tests := []struct {
		name  string
		a, b  Sharing
		equal bool
	}{
		{"equal sharings", mps(4, pct(25), q("18Gi")), mps(4, pct(25), q("18Gi")), true},
		{"the same quantity written differently", mps(4, nil, q("1024Mi")), mps(4, nil, q("1Gi")), true},
		{"replicas differ", mps(4, nil, nil), mps(2, nil, nil), false},
		{"a limit is added", mps(4, nil, nil), mps(4, nil, q("1Gi")), false},
		{"strategies differ", Sharing{Strategy: StrategyExclusive}, Sharing{Strategy: StrategyMPS}, false},
		{"MIG counts differ",
			Sharing{Strategy: StrategyMIG, MIG: &MIGSharing{Instances: []MIGInstanceRequest{{Profile: "1g.10gb", Count: 2}}}},
			Sharing{Strategy: StrategyMIG, MIG: &MIGSharing{Instances: []MIGInstanceRequest{{Profile: "1g.10gb", Count: 3}}}}, false},
	}
	for _, tt := range tests {
		ha, hb := SharingHash(tt.a), SharingHash(tt.b)
		if (ha == hb) != tt.equal || len(ha) != 16 {
			t.Errorf("%s: hashes %s and %s, want equal=%v (16 hex digits)", tt.name, ha, hb, tt.equal)
		}
	}
}
