package mig

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// mockProfiles reads the profiles of GPU 0 of a mock server through the agent's NVML code.
func mockProfiles(t *testing.T, s *nvmlmock.Server) []gpu.Profile {
	t.Helper()
	d, err := gpu.NewNVML(s).Device(context.Background(), s.GPUs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	return d.Profiles
}

func wants(spec string) []Want {
	var out []Want
	for _, part := range strings.Split(spec, " + ") {
		var w Want
		if _, err := fmt.Sscanf(strings.Replace(part, " x", " ", 1), "%s %d", &w.Profile, &w.Count); err != nil {
			panic(part)
		}
		out = append(out, w)
	}
	return out
}

// layout renders a plan's resulting instances as "profile@start" sorted by start.
func layout(p Plan) string {
	var parts []string
	for _, k := range p.Keep {
		parts = append(parts, fmt.Sprintf("%s@%d", k.Profile, k.Placement.Start))
	}
	for _, c := range p.Create {
		parts = append(parts, fmt.Sprintf("%s@%d", c.Profile.Name, c.At.Start))
	}
	sort.Slice(parts, func(i, j int) bool {
		var a, b int
		fmt.Sscanf(parts[i][strings.Index(parts[i], "@")+1:], "%d", &a)
		fmt.Sscanf(parts[j][strings.Index(parts[j], "@")+1:], "%d", &b)
		return a < b
	})
	return strings.Join(parts, " ")
}

func TestMakePlanPlacesMixedLayoutsOnAnEmptyGPU(t *testing.T) {
	a100 := mockProfiles(t, nvmlmock.NewA100(1))
	h100 := mockProfiles(t, nvmlmock.NewH100(1))
	tests := []struct {
		name     string
		profiles []gpu.Profile
		want     string
		layout   string
	}{
		{"a100 3g + 4x1g", a100, "3g.20gb x1 + 1g.5gb x4", "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 3g.20gb@4"},
		{"a100 seven 1g", a100, "1g.5gb x7", "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6"},
		{"a100 4g + 3g", a100, "4g.20gb x1 + 3g.20gb x1", "4g.20gb@0 3g.20gb@4"},
		{"a100 whole GPU", a100, "7g.40gb x1", "7g.40gb@0"},
		{"a100 2g x3 + 1g", a100, "2g.10gb x3 + 1g.5gb x1", "2g.10gb@0 2g.10gb@2 2g.10gb@4 1g.5gb@6"},
		{"h100 3g + 2g + 2g", h100, "3g.40gb x1 + 2g.20gb x2", "2g.20gb@0 2g.20gb@2 3g.40gb@4"},
		{"h100 1g.20gb + 1g.10gb", h100, "1g.20gb x2 + 1g.10gb x3", "1g.20gb@0 1g.20gb@2 1g.10gb@4 1g.10gb@5 1g.10gb@6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := MakePlan(tt.profiles, nil, wants(tt.want))
			if err != nil {
				t.Fatalf("MakePlan: %v", err)
			}
			if got := layout(plan); got != tt.layout {
				t.Errorf("layout = %q, want %q", got, tt.layout)
			}
			if len(plan.Destroy) != 0 || len(plan.Keep) != 0 {
				t.Errorf("plan on an empty GPU keeps %v and destroys %v", plan.Keep, plan.Destroy)
			}
		})
	}
}

func TestMakePlanExplainsLayoutsThatDoNotFit(t *testing.T) {
	a100 := mockProfiles(t, nvmlmock.NewA100(1))
	tests := []struct {
		name    string
		want    string
		message string
	}{
		{"two 4-slice instances", "4g.20gb x1 + 3g.20gb x1 + 1g.5gb x1",
			"the layout needs 8 compute slices (4g.20gb x1 + 3g.20gb x1 + 1g.5gb x1); this GPU has 7"},
		{"profile not offered", "5g.30gb x1",
			"profile 5g.30gb is not offered by this GPU (it offers 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"},
		{"more than the profile's max", "3g.20gb x3",
			"3g.20gb x3: this GPU holds at most 2 instances of 3g.20gb"},
		{"compute slices fit but memory slices do not", "3g.20gb x1 + 1g.10gb x4",
			"1g.10gb x4 needs placements at {0,2,4,6}; slices 0-3 are taken by 3g.20gb, slices 4-5 are taken by 1g.10gb, slices 6-7 are taken by 1g.10gb; free memory slices: none"},
		{"3g with 2g x2", "3g.20gb x2 + 1g.10gb x1",
			"1g.10gb x1 needs placements at {0,2,4,6}; slices 0-3 are taken by 3g.20gb, slices 4-7 are taken by 3g.20gb; free memory slices: none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := MakePlan(a100, nil, wants(tt.want))
			var nf *NoFitError
			if !errors.As(err, &nf) {
				t.Fatalf("err = %v, want a NoFitError", err)
			}
			if nf.Message != tt.message {
				t.Errorf("message =\n  %q\nwant\n  %q", nf.Message, tt.message)
			}
		})
	}
}

func TestMakePlanKeepsMatchingInstancesAndDestroysTheRest(t *testing.T) {
	a100 := mockProfiles(t, nvmlmock.NewA100(1))
	inst := func(profile string, start, size, gi int) gpu.Instance {
		return gpu.Instance{Profile: profile, Placement: gpu.Placement{Start: start, Size: size}, GIID: gi, CIID: 0}
	}
	tests := []struct {
		name     string
		existing []gpu.Instance
		want     string
		keep     []int // GI ids kept
		destroy  []int
		layout   string
	}{
		{"partial layout is completed around what exists",
			[]gpu.Instance{inst("1g.5gb", 6, 1, 3), inst("3g.20gb", 0, 4, 1)},
			"3g.20gb x1 + 1g.5gb x3", []int{1, 3}, nil, "3g.20gb@0 1g.5gb@4 1g.5gb@5 1g.5gb@6"},
		{"instances of unwanted profiles go",
			[]gpu.Instance{inst("2g.10gb", 0, 2, 1), inst("3g.20gb", 4, 4, 2)},
			"3g.20gb x1 + 1g.5gb x2", []int{2}, []int{1}, "1g.5gb@0 1g.5gb@1 3g.20gb@4"},
		{"surplus instances of a wanted profile go",
			[]gpu.Instance{inst("1g.5gb", 0, 1, 1), inst("1g.5gb", 1, 1, 2), inst("1g.5gb", 2, 1, 3)},
			"1g.5gb x2", []int{1, 2}, []int{3}, "1g.5gb@0 1g.5gb@1"},
		{"an instance that blocks the layout is moved",
			[]gpu.Instance{inst("1g.5gb", 3, 1, 1)},
			"4g.20gb x1 + 1g.5gb x1", nil, []int{1}, "4g.20gb@0 1g.5gb@4"},
		{"nothing to do when the layout already exists",
			[]gpu.Instance{inst("4g.20gb", 0, 4, 1), inst("3g.20gb", 4, 4, 2)},
			"4g.20gb x1 + 3g.20gb x1", []int{1, 2}, nil, "4g.20gb@0 3g.20gb@4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := MakePlan(a100, tt.existing, wants(tt.want))
			if err != nil {
				t.Fatalf("MakePlan: %v", err)
			}
			if got := giIDs(plan.Keep); fmt.Sprint(got) != fmt.Sprint(tt.keep) {
				t.Errorf("keep = %v, want %v", got, tt.keep)
			}
			if got := giIDs(plan.Destroy); fmt.Sprint(got) != fmt.Sprint(tt.destroy) {
				t.Errorf("destroy = %v, want %v", got, tt.destroy)
			}
			if got := layout(plan); got != tt.layout {
				t.Errorf("layout = %q, want %q", got, tt.layout)
			}
			if tt.name == "nothing to do when the layout already exists" && plan.Changes() {
				t.Errorf("plan changes something: %+v", plan)
			}
		})
	}
}

func giIDs(in []gpu.Instance) []int {
	var out []int
	for _, i := range in {
		out = append(out, i.GIID)
	}
	sort.Ints(out)
	return out
}
