package resolve_test

import (
	"testing"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

func TestPlanNode(t *testing.T) {
	mps := b.MPS(4, 0)
	mig := b.MIG("3g.40gb", 2)
	migPolicy := b.Policy("mig", b.WithSharing(mig), b.WithIndices(0))
	mpsPolicy := b.Policy("mps", b.WithSharing(b.MPS(4, 50)), b.WithIndices(1))
	unlimited := v1.Sharing{Strategy: v1.StrategyMPS, MPS: &v1.MPSSharing{Replicas: 4}}
	sizedMPS := sized(unlimited, "2Gi")
	sizedPolicy := b.Policy("sized", b.WithSharing(sizedMPS), b.WithIndices(0))
	tests := []struct {
		name        string
		policies    []*v1.GPUSharingPolicy
		node        *v1.GPUNode
		admitted    map[string]bool
		wantSpec    []v1.GPUDesired
		wantWaiting []string
	}{
		{
			name:     "writes a non-disruptive change at once and holds a disruptive one that is not admitted",
			policies: []*v1.GPUSharingPolicy{migPolicy, mpsPolicy},
			node: b.GPUNode("n",
				b.WithSpec(b.Desired("n", 1, "mps", 1, mps)),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(b.Exclusive(), "")), b.GPU("n", 1, b.WithApplied(mps, "mps")))),
			wantSpec:    []v1.GPUDesired{b.Desired("n", 1, "mps", 1, b.MPS(4, 50))},
			wantWaiting: []string{"mig"},
		},
		{
			name:     "writes an admitted disruptive change",
			policies: []*v1.GPUSharingPolicy{migPolicy},
			node:     b.GPUNode("n", b.WithGPUs(b.GPU("n", 0, b.WithApplied(b.Exclusive(), "")))),
			admitted: map[string]bool{"mig": true},
			wantSpec: []v1.GPUDesired{b.Desired("n", 0, "mig", 1, mig)},
		},
		{
			name:        "holds sizing per claim on an MPS GPU as a disruptive change",
			policies:    []*v1.GPUSharingPolicy{sizedPolicy},
			node:        b.GPUNode("n", b.WithSpec(b.Desired("n", 0, "sized", 1, unlimited)), b.WithGPUs(b.GPU("n", 0, b.WithApplied(unlimited, "sized")))),
			wantSpec:    []v1.GPUDesired{b.Desired("n", 0, "sized", 1, unlimited)},
			wantWaiting: []string{"sized"},
		},
		{
			name:     "writes the sizing into the GPU's desired state once admitted",
			policies: []*v1.GPUSharingPolicy{sizedPolicy},
			node:     b.GPUNode("n", b.WithSpec(b.Desired("n", 0, "sized", 1, unlimited)), b.WithGPUs(b.GPU("n", 0, b.WithApplied(unlimited, "sized")))),
			admitted: map[string]bool{"sized": true},
			wantSpec: []v1.GPUDesired{b.Desired("n", 0, "sized", 1, sizedMPS)},
		},
		{
			name: "returns a GPU its policy no longer selects to the default",
			node: b.GPUNode("n",
				b.WithSpec(b.Desired("n", 0, "gone", 1, mig)),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(mig, "gone")))),
			wantSpec: []v1.GPUDesired{b.Desired("n", 0, "", 0, resolve.DefaultSharing())},
		},
		{
			name: "keeps the default listed until the agent applies it",
			node: b.GPUNode("n",
				b.WithSpec(b.Desired("n", 0, "", 0, resolve.DefaultSharing())),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(mig, "gone")))),
			wantSpec: []v1.GPUDesired{b.Desired("n", 0, "", 0, resolve.DefaultSharing())},
		},
		{
			name: "drops the default once applied, leaving the GPU as found",
			node: b.GPUNode("n",
				b.WithSpec(b.Desired("n", 0, "", 0, resolve.DefaultSharing())),
				b.WithGPUs(b.GPU("n", 0, b.WithApplied(resolve.DefaultSharing(), "")))),
		},
		{
			name: "leaves a GPU no policy ever configured unlisted",
			node: b.GPUNode("n", b.WithGPUs(b.GPU("n", 0))),
		},
		{
			name:     "drops the entry of a GPU the agent no longer reports",
			policies: []*v1.GPUSharingPolicy{mpsPolicy},
			node: b.GPUNode("n",
				b.WithSpec(b.Desired("n", 1, "mps", 1, b.MPS(4, 50)), b.Desired("n", 7, "mps", 1, b.MPS(4, 50))),
				b.WithGPUs(b.GPU("n", 1, b.WithApplied(b.MPS(4, 50), "mps")))),
			wantSpec: []v1.GPUDesired{b.Desired("n", 1, "mps", 1, b.MPS(4, 50))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := resolve.ResolveNode(resolve.Compile(tt.policies), nil, tt.node.Status.GPUs)
			spec, waiting := resolve.Build(resolve.Wishes(res, tt.node), tt.admitted)
			if len(spec) != len(tt.wantSpec) {
				t.Fatalf("spec has %d entries, want %d: %+v", len(spec), len(tt.wantSpec), spec)
			}
			for i := range spec {
				if spec[i].UUID != tt.wantSpec[i].UUID || spec[i].Policy != tt.wantSpec[i].Policy ||
					v1.SharingHash(spec[i].Sharing) != v1.SharingHash(tt.wantSpec[i].Sharing) {
					t.Errorf("entry %d = %+v, want %+v", i, spec[i], tt.wantSpec[i])
				}
			}
			if !equal(waiting, tt.wantWaiting) {
				t.Errorf("waiting = %v, want %v", waiting, tt.wantWaiting)
			}
		})
	}
}
