package rightsizing

import (
	"regexp"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/recommend"
)

func TestModeOf(t *testing.T) {
	initial := map[string]string{v1.RightsizingModeKey: "Initial"}
	off := map[string]string{v1.RightsizingModeKey: "Off"}
	for _, tt := range []struct {
		name               string
		workload, nsl, nsa map[string]string
		want               v1.RightsizingMode
	}{
		{"nothing set is Off", nil, nil, nil, v1.RightsizingOff},
		{"a namespace label opts in", nil, initial, nil, v1.RightsizingInitial},
		{"a namespace annotation opts in", nil, nil, initial, v1.RightsizingInitial},
		{"a workload opts out of its namespace's Initial", off, initial, nil, v1.RightsizingOff},
		{"a workload opts in alone", initial, nil, nil, v1.RightsizingInitial},
		{"an unknown value is Off", map[string]string{v1.RightsizingModeKey: "Auto"}, initial, nil, v1.RightsizingOff},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := modeOf(tt.workload, tt.nsl, tt.nsa); got != tt.want {
				t.Errorf("modeOf = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestBoundsOf(t *testing.T) {
	for _, tt := range []struct {
		name     string
		ann      map[string]string
		min, max int64
		bad      bool
	}{
		{"none", nil, 0, 0, false},
		{"both", map[string]string{v1.RightsizingMinMemoryKey: "1Gi", v1.RightsizingMaxMemoryKey: "8Gi"}, 1 << 30, 8 << 30, false},
		{"not a quantity", map[string]string{v1.RightsizingMaxMemoryKey: "lots"}, 0, 0, true},
		{"min above max", map[string]string{v1.RightsizingMinMemoryKey: "9Gi", v1.RightsizingMaxMemoryKey: "8Gi"}, 9 << 30, 8 << 30, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := boundsOf(tt.ann)
			if (b.err != nil) != tt.bad || (!tt.bad && (b.min != tt.min || b.max != tt.max)) {
				t.Errorf("boundsOf = %+v, want min %d max %d bad %v", b, tt.min, tt.max, tt.bad)
			}
		})
	}
}

func TestStatusFor(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	w := recommend.NewWorkload(recommend.DefaultConfig())
	tgt := target{Namespace: "ns", Workload: v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, PodClaim: "gpu", Request: "gpu"}
	in := statusInput{t: tgt, w: w, claimMemory: 10 << 30, step: 512 << 20, mode: v1.RightsizingInitial, now: t0}

	w.ObserveMemory("a", 3<<30, t0)
	s := statusFor(in)
	c := meta.FindStatusCondition(s.Conditions, v1.ConditionRecommended)
	if c == nil || c.Reason != v1.ReasonNotEnoughSamples || c.Message != "1 of 3 pod peaks; needs 10m0s of history, first sample 2026-12-01T00:00:00Z" || s.InitialMemory != nil {
		t.Fatalf("with one peak: %+v, initial %v", c, s.InitialMemory)
	}

	w.ObserveMemory("b", 3<<30, t0)
	w.ObserveMemory("c", 3<<30, t0)
	in.now = t0.Add(10 * time.Minute)
	s = statusFor(in)
	if c := meta.FindStatusCondition(s.Conditions, v1.ConditionRecommended); c == nil || c.Reason != v1.ReasonRecommended {
		t.Fatalf("condition %+v, want Recommended", c)
	}
	if s.InitialMemory.String() != "3584Mi" || s.MemoryFreed.String() != "6656Mi" || s.Samples != 3 {
		t.Errorf("initial %s freed %s samples %d, want 3584Mi, 6656Mi, 3", s.InitialMemory, s.MemoryFreed, s.Samples)
	}
	if s.PodNamePattern != `^web-[a-z0-9]{1,10}-[a-z0-9]{5}$` {
		t.Errorf("pattern %s", s.PodNamePattern)
	}

	in.bounds = boundsOf(map[string]string{v1.RightsizingMaxMemoryKey: "lots"})
	s = statusFor(in)
	if c := meta.FindStatusCondition(s.Conditions, v1.ConditionRecommended); c == nil || c.Reason != v1.ReasonBoundsInvalid || s.InitialMemory != nil {
		t.Errorf("with a bad bound: %+v, initial %v; want BoundsInvalid and no initial size", c, s.InitialMemory)
	}
	if s.Memory == nil {
		t.Error("a bad bound hides the recommendation itself")
	}
}

func TestPodNamePattern(t *testing.T) {
	for _, tt := range []struct {
		w    v1.WorkloadRef
		pod  string
		want bool
	}{
		{v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, "web-7d9f8c6b5-x2x4z", true},
		{v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, "web-extra-7d9f8c6b5-x2x4z", false},
		{v1.WorkloadRef{Kind: v1.WorkloadStatefulSet, Name: "db"}, "db-12", true},
		{v1.WorkloadRef{Kind: v1.WorkloadStatefulSet, Name: "db"}, "db-x", false},
		{v1.WorkloadRef{Kind: v1.WorkloadJob, Name: "train"}, "train-abcde", true},
		{v1.WorkloadRef{Kind: v1.WorkloadJob, Name: "train"}, "train-3-abcde", true},
		{v1.WorkloadRef{Kind: v1.WorkloadCronJob, Name: "nightly"}, "nightly-29412345-abcde", true},
		{v1.WorkloadRef{Kind: v1.WorkloadPod, Name: "solo"}, "solo", true},
		{v1.WorkloadRef{Kind: v1.WorkloadPod, Name: "solo"}, "solo2", false},
	} {
		if got := regexpMatch(PodNamePattern(tt.w), tt.pod); got != tt.want {
			t.Errorf("%s %s matches %s: %v, want %v", tt.w.Kind, tt.w.Name, tt.pod, got, tt.want)
		}
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }
