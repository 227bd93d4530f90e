package resolve_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

func TestChangeIsDisruptive(t *testing.T) {
	mps4 := b.MPS(4, 25)
	mig := b.MIG("3g.40gb", 1, "1g.10gb", 4)
	mpsUnset := v1.Sharing{Strategy: v1.StrategyMPS, MPS: &v1.MPSSharing{Replicas: 4}}
	tests := []struct {
		name    string
		current *v1.Sharing
		applied *v1.AppliedSharing
		want    v1.Sharing
		disrupt bool
	}{
		{"MPS thread percentage goes out at once", &mps4, b.AppliedFor(mps4, "p"), b.MPS(4, 50), false},
		{"MPS memory limit goes out at once", &mps4, b.AppliedFor(mps4, "p"), b.MPSWithMemory(4, "10Gi"), false},
		{"time-slice replicas and interval go out at once",
			ptr(b.TimeSlicing(2, v1.TimeSliceDefault)), b.AppliedFor(b.TimeSlicing(2, v1.TimeSliceDefault), "p"), b.TimeSlicing(8, v1.TimeSliceLong), false},
		{"oversubscription settings go out at once",
			ptr(withOversub(b.Exclusive())), b.AppliedFor(withOversub(b.Exclusive()), "p"), withQuantum(withOversub(b.Exclusive()), "5s"), false},
		{"turning oversubscription on disrupts",
			ptr(b.Exclusive()), b.AppliedFor(b.Exclusive(), "p"), withOversub(b.Exclusive()), true},
		{"turning oversubscription off disrupts",
			ptr(withOversub(b.Exclusive())), b.AppliedFor(withOversub(b.Exclusive()), "p"), b.Exclusive(), true},
		{"a strategy change disrupts", &mps4, b.AppliedFor(mps4, "p"), b.TimeSlicing(4, v1.TimeSliceDefault), true},
		{"a MIG layout change disrupts", &mig, b.AppliedFor(mig, "p"), b.MIG("3g.40gb", 2), true},
		{"the same MIG layout listed in another order does not disrupt", &mig, b.AppliedFor(mig, "p"), b.MIG("1g.10gb", 4, "3g.40gb", 1), false},
		{"an unlisted GPU already running the shape is not disrupted", nil, b.AppliedFor(b.Exclusive(), ""), b.Exclusive(), false},
		{"an unlisted GPU running another strategy is disrupted", nil, b.AppliedFor(b.Exclusive(), ""), mps4, true},
		{"a GPU whose applied state is unknown is treated as disrupted", nil, nil, b.Exclusive(), true},
		{"a tweak on top of a disruptive change still in flight counts as disruptive", &mps4, b.AppliedFor(b.Exclusive(), ""), b.MPS(4, 50), true},
		{"sizing MPS per claim disrupts", &mpsUnset, b.AppliedFor(mpsUnset, "p"), sized(mpsUnset, "1Gi"), true},
		{"going back to fixed shares disrupts", ptr(sized(mpsUnset, "1Gi")), b.AppliedFor(sized(mpsUnset, "1Gi"), "p"), mpsUnset, true},
		{"an explicit Fixed sizing does not disrupt", &mpsUnset, b.AppliedFor(mpsUnset, "p"), fixed(mpsUnset), false},
		{"a sized GPU's memory step goes out at once",
			ptr(sized(mpsUnset, "1Gi")), b.AppliedFor(sized(mpsUnset, "1Gi"), "p"), sized(mpsUnset, "2Gi"), false},
		{"a sized GPU still applied fixed is disrupted", ptr(sized(mpsUnset, "1Gi")), b.AppliedFor(mpsUnset, "p"), sized(mpsUnset, "2Gi"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve.ChangeIsDisruptive(tt.current, tt.applied, tt.want); got != tt.disrupt {
				t.Errorf("ChangeIsDisruptive = %v, want %v", got, tt.disrupt)
			}
		})
	}
}

func TestMaxUnavailable(t *testing.T) {
	tests := []struct {
		name     string
		value    *intstr.IntOrString
		selected int
		want     int
	}{
		{"defaults to one node", nil, 10, 1},
		{"takes a count as is", ptr(intstr.FromInt32(3)), 10, 3},
		{"rounds a percentage down", ptr(intstr.FromString("25%")), 10, 2},
		{"never goes below one node", ptr(intstr.FromString("10%")), 3, 1},
		{"allows every node at 100%", ptr(intstr.FromString("100%")), 6, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve.MaxUnavailable(v1.Rollout{MaxUnavailable: tt.value}, tt.selected); got != tt.want {
				t.Errorf("MaxUnavailable = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name          string
		already       bool
		others, limit int
		want          bool
	}{
		{"admits while the budget has room", false, 0, 1, true},
		{"holds a node when the budget is spent", false, 1, 1, false},
		{"lets a node already in flight add GPUs", true, 1, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve.Admit(tt.already, tt.others, tt.limit); got != tt.want {
				t.Errorf("Admit = %v, want %v", got, tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func sized(s v1.Sharing, step string) v1.Sharing {
	q := resource.MustParse(step)
	s.Sizing = &v1.Sizing{Mode: v1.SizingPerClaim, MemoryStep: &q}
	return s
}

func fixed(s v1.Sharing) v1.Sharing {
	s.Sizing = &v1.Sizing{Mode: v1.SizingFixed}
	return s
}

func withOversub(s v1.Sharing) v1.Sharing {
	s.Oversubscription = &v1.Oversubscription{AntiThrashing: v1.AntiThrashingAlways}
	return s
}

func withQuantum(s v1.Sharing, q string) v1.Sharing {
	d, err := time.ParseDuration(q)
	if err != nil {
		panic(err)
	}
	s.Oversubscription.TimeQuantum = &metav1.Duration{Duration: d}
	return s
}
