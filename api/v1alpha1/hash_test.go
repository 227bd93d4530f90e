package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// legacyHash is SharingHash as it was before the canonical form was versioned: the hashes agents have
// already written into status. Version 1 must reproduce it bit for bit.
func legacyHash(s Sharing) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

func TestSharingHashKeepsTheHashesAgentsAlreadyWrote(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	pct := func(v int32) *int32 { return &v }
	d := func(s string) *metav1.Duration { v, _ := time.ParseDuration(s); return &metav1.Duration{Duration: v} }
	for _, s := range []Sharing{
		{Strategy: StrategyExclusive},
		{Strategy: StrategyExclusive, Oversubscription: &Oversubscription{}},
		{Strategy: StrategyExclusive, Oversubscription: &Oversubscription{TimeQuantum: d("20s"), AntiThrashing: AntiThrashingAuto, MemoryBudget: q("16Gi")}},
		{Strategy: StrategyTimeSlicing, TimeSlicing: &TimeSlicingSharing{Replicas: 4}},
		{Strategy: StrategyTimeSlicing, TimeSlicing: &TimeSlicingSharing{Replicas: 4, Interval: TimeSliceDefault}},
		{Strategy: StrategyTimeSlicing, TimeSlicing: &TimeSlicingSharing{Replicas: 8, Interval: TimeSliceLong},
			Oversubscription: &Oversubscription{TimeQuantum: d("1m30s"), AntiThrashing: AntiThrashingAlways}},
		{Strategy: StrategyMPS, MPS: &MPSSharing{Replicas: 4}},
		{Strategy: StrategyMPS, MPS: &MPSSharing{Replicas: 4, ActiveThreadPercentage: pct(25), PinnedMemoryLimit: q("18Gi")}},
		{Strategy: StrategyMIG, MIG: &MIGSharing{Instances: []MIGInstanceRequest{{Profile: "3g.40gb", Count: 1}, {Profile: "1g.10gb+me", Count: 4}}}},
	} {
		if got, want := SharingHash(s), legacyHash(s); got != want {
			b, _ := json.Marshal(s)
			t.Errorf("SharingHash(%s) = %s, want the pre-versioning hash %s", b, got, want)
		}
	}
	// Pinned values, so that a change of encoding/json or of the types' JSON tags cannot move both sides.
	if got := SharingHash(Sharing{Strategy: StrategyExclusive}); got != "818772ac84b14a89" {
		t.Errorf("SharingHash(Exclusive) = %s, want 818772ac84b14a89", got)
	}
}

// The types below are what a later version's Sharing might look like: timeSlicing gains a defaulted
// field and a field without default, and the union gains a required-looking int without omitempty.
type futureTimeSlicing struct {
	Replicas         int32             `json:"replicas"`
	Interval         TimeSliceInterval `json:"interval,omitempty"`
	Fairness         string            `json:"fairness,omitempty"` // +kubebuilder:default=RoundRobin
	MaxClientsPerPod *int32            `json:"maxClientsPerPod,omitempty"`
}

type futureSharing struct {
	Strategy         Strategy           `json:"strategy"`
	MPS              *MPSSharing        `json:"mps,omitempty"`
	TimeSlicing      *futureTimeSlicing `json:"timeSlicing,omitempty"`
	MIG              *MIGSharing        `json:"mig,omitempty"`
	Oversubscription *Oversubscription  `json:"oversubscription,omitempty"`
	Weight           int32              `json:"weight"`
}

var futureLaterDefaults = map[string]string{
	"timeSlicing.fairness":         `"RoundRobin"`,
	"timeSlicing.maxClientsPerPod": "",
	"weight":                       "",
}

func TestSharingHashOfAnObjectWrittenTodayStaysAppliedAfterAFieldIsAdded(t *testing.T) {
	pct := func(v int32) *int32 { return &v }
	for _, today := range []Sharing{
		{Strategy: StrategyTimeSlicing, TimeSlicing: &TimeSlicingSharing{Replicas: 4, Interval: TimeSliceShort}},
		{Strategy: StrategyTimeSlicing, TimeSlicing: &TimeSlicingSharing{Replicas: 2}, Oversubscription: &Oversubscription{AntiThrashing: AntiThrashingAuto}},
		{Strategy: StrategyMPS, MPS: &MPSSharing{Replicas: 4, ActiveThreadPercentage: pct(25)}},
	} {
		stored, err := json.Marshal(today)
		if err != nil {
			t.Fatal(err)
		}
		applied := SharingHash(today) // what today's agent wrote into status
		// The later version reads the stored object; the API server defaults the new field on read.
		var later futureSharing
		if err := json.Unmarshal(stored, &later); err != nil {
			t.Fatal(err)
		}
		if later.TimeSlicing != nil && later.TimeSlicing.Fairness == "" {
			later.TimeSlicing.Fairness = "RoundRobin"
		}
		got, err := sharingHash(later, futureLaterDefaults)
		if err != nil {
			t.Fatal(err)
		}
		if got != applied {
			t.Errorf("%s: the later version hashes %s, but today's agent wrote %s: the GPU would read as not applied after the upgrade", stored, got, applied)
		}
		// Setting a new field to something else is a real change and must read as not applied.
		changed := later
		changed.Weight = 3
		if h, _ := sharingHash(changed, futureLaterDefaults); h == applied {
			t.Errorf("%s: weight 3 hashes like the stored sharing", stored)
		}
		if later.TimeSlicing != nil {
			ts := *later.TimeSlicing
			ts.Fairness = "Weighted"
			changed := later
			changed.TimeSlicing = &ts
			if h, _ := sharingHash(changed, futureLaterDefaults); h == applied {
				t.Errorf("%s: fairness Weighted hashes like the default", stored)
			}
		}
	}
}

// A field added to Sharing must be registered in sharingHashLaterDefaults (with its default), or the
// upgrade promise above silently breaks; a v1 field that disappears must be removed from the v1 list.
func TestSharingHashCoversEveryField(t *testing.T) {
	seen := map[string]bool{}
	var walk func(t reflect.Type, path string)
	walk = func(typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ.PkgPath() != reflect.TypeOf(Sharing{}).PkgPath() {
			return // quantities, durations and scalars are leaves
		}
		for i := 0; i < typ.NumField(); i++ {
			name, _, ok := jsonName(typ.Field(i))
			if !ok {
				continue
			}
			p := joinPath(path, name)
			seen[p] = true
			_, later := sharingHashLaterDefaults[p]
			if !sharingHashV1Fields[p] && !later {
				t.Errorf("Sharing field %s is neither a version-1 field nor registered in sharingHashLaterDefaults (with its default)", p)
			}
			walk(typ.Field(i).Type, p)
		}
	}
	walk(reflect.TypeOf(Sharing{}), "")
	for p := range sharingHashV1Fields {
		if !seen[p] {
			t.Errorf("sharingHashV1Fields lists %s, which Sharing no longer has", p)
		}
	}
}
