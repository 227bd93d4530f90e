package resolve_test

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestGPUSelected(t *testing.T) {
	gpu := b.GPU("n1", 2, b.WithProduct(b.A100))
	if strings.ToUpper(gpu.UUID) == gpu.UUID {
		t.Fatalf("test UUID %s has no lower-case letters to compare", gpu.UUID)
	}
	tests := []struct {
		name string
		sel  *v1.GPUSelector
		want bool
	}{
		{"an omitted selector selects every GPU", nil, true},
		{"selects by product name", &v1.GPUSelector{Products: []string{b.H100, b.A100}}, true},
		{"skips another product", &v1.GPUSelector{Products: []string{b.H100}}, false},
		{"selects by index", &v1.GPUSelector{Indices: []int32{0, 2}}, true},
		{"skips another index", &v1.GPUSelector{Indices: []int32{1}}, false},
		{"selects by UUID regardless of case", &v1.GPUSelector{UUIDs: []string{strings.ToUpper(b.UUID("n1", 2))}}, true},
		{"skips another UUID", &v1.GPUSelector{UUIDs: []string{b.UUID("n1", 3)}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve.GPUSelected(tt.sel, &gpu); got != tt.want {
				t.Errorf("GPUSelected = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCompileOrdersByPrecedenceAndDropsDeleting(t *testing.T) {
	deleting := b.Policy("deleting", b.WithPriority(100))
	now := b.Policy("x").CreationTimestamp
	now.Time = t0
	deleting.DeletionTimestamp = &now
	got := resolve.Compile([]*v1.GPUSharingPolicy{
		b.Policy("low", b.WithPriority(1)),
		b.Policy("young", b.WithPriority(5), b.WithCreated(t0.Add(time.Hour))),
		b.Policy("old-b", b.WithPriority(5), b.WithCreated(t0)),
		b.Policy("old-a", b.WithPriority(5), b.WithCreated(t0)),
		deleting,
	})
	want := []string{"old-a", "old-b", "young", "low"}
	if len(got) != len(want) {
		t.Fatalf("Compile kept %d policies, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].Policy.Name != w {
			t.Errorf("position %d = %s, want %s", i, got[i].Policy.Name, w)
		}
	}
}

func TestResolveNode(t *testing.T) {
	gpus := []v1.GPUStatus{
		b.GPU("n1", 0, b.WithProduct(b.H100)),
		b.GPU("n1", 1, b.WithProduct(b.A100)),
	}
	labels := map[string]string{"pool": "inference", "zone": "a"}
	tests := []struct {
		name        string
		policies    []*v1.GPUSharingPolicy
		wantWinners []string // per GPU; "" for none
		wantTied    [][]string
	}{
		{
			name:        "leaves GPUs no policy selects without a winner",
			policies:    []*v1.GPUSharingPolicy{b.Policy("train", b.WithNodeLabels("pool", "training"))},
			wantWinners: []string{"", ""},
		},
		{
			name: "gives each GPU to the policy whose selectors match it",
			policies: []*v1.GPUSharingPolicy{
				b.Policy("h100", b.WithNodeLabels("pool", "inference"), b.WithProducts(b.H100)),
				b.Policy("a100", b.WithNodeLabels("zone", "a"), b.WithProducts(b.A100)),
			},
			wantWinners: []string{"h100", "a100"},
		},
		{
			name: "lets the higher priority win an overlap",
			policies: []*v1.GPUSharingPolicy{
				b.Policy("all", b.WithPriority(1), b.WithNodeLabels("pool", "inference")),
				b.Policy("gpu1", b.WithPriority(9), b.WithIndices(1)),
			},
			wantWinners: []string{"all", "gpu1"},
		},
		{
			name: "breaks an equal-priority tie by age then name and reports every tied policy",
			policies: []*v1.GPUSharingPolicy{
				b.Policy("b", b.WithPriority(3), b.WithCreated(t0)),
				b.Policy("a", b.WithPriority(3), b.WithCreated(t0)),
				b.Policy("older", b.WithPriority(3), b.WithCreated(t0.Add(-time.Hour)), b.WithIndices(0)),
				b.Policy("lower", b.WithPriority(2)),
			},
			wantWinners: []string{"older", "a"},
			wantTied:    [][]string{{"older", "a", "b"}, {"a", "b"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := resolve.ResolveNode(resolve.Compile(tt.policies), labels, gpus)
			for i, r := range res {
				got := ""
				if r.Winner != nil {
					got = r.Winner.Name
				}
				if got != tt.wantWinners[i] {
					t.Errorf("GPU %d winner = %q, want %q", i, got, tt.wantWinners[i])
				}
				if tt.wantTied == nil {
					if r.Conflicted() {
						t.Errorf("GPU %d reported a conflict among %d policies", i, len(r.Tied))
					}
					continue
				}
				var tied []string
				for _, p := range r.Tied {
					tied = append(tied, p.Name)
				}
				if !equal(tied, tt.wantTied[i]) {
					t.Errorf("GPU %d tied = %v, want %v", i, tied, tt.wantTied[i])
				}
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
