package mig

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// realH100 is `agent inventory` run on a real H100 80GB HBM3 (driver 580.159.04) by
// test/gpu/agent/run.sh (agent/gpu/nvmlmock/inventories): its MIG profiles differ from go-nvml's dgxh100
// mock in ids, sizes and starts.
func realH100(t *testing.T) (gpu.Inventory, gpu.Device) {
	t.Helper()
	inv, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Devices) != 1 || inv.Devices[0].Product != "NVIDIA H100 80GB HBM3" {
		t.Fatalf("fixture holds %d devices, first %q", len(inv.Devices), inv.Devices[0].Product)
	}
	return inv, inv.Devices[0]
}

func TestRealH100FixtureHasTheProfilesNVMLReported(t *testing.T) {
	_, d := realH100(t)
	got := map[string]string{}
	for _, p := range d.Profiles {
		var pls []string
		for _, pl := range p.Placements {
			pls = append(pls, fmt.Sprintf("%d+%d", pl.Start, pl.Size))
		}
		got[p.Name] = fmt.Sprintf("id %d, %d slices, max %d, at %s", p.ID, p.SliceCount, p.MaxInstances, strings.Join(pls, " "))
	}
	want := map[string]string{
		"1g.10gb":    "id 19, 1 slices, max 7, at 0+1 1+1 2+1 3+1 4+1 5+1 6+1",
		"1g.10gb+me": "id 20, 1 slices, max 1, at 0+1 1+1 2+1 3+1 4+1 5+1 6+1",
		"1g.20gb":    "id 15, 1 slices, max 4, at 0+2 2+2 4+2 6+2",
		"2g.20gb":    "id 14, 2 slices, max 3, at 0+2 2+2 4+2",
		"3g.40gb":    "id 9, 3 slices, max 2, at 0+4 4+4",
		"4g.40gb":    "id 5, 4 slices, max 1, at 0+4",
		"7g.80gb":    "id 0, 7 slices, max 1, at 0+8",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("profiles =\n%v\nwant\n%v", got, want)
	}
}

func TestMakePlanOnTheRealH100(t *testing.T) {
	_, d := realH100(t)
	tests := []struct {
		want   string
		layout string // empty when it must not fit
		msg    string
	}{
		{"7g.80gb x1", "7g.80gb@0", ""},
		{"3g.40gb x2", "3g.40gb@0 3g.40gb@4", ""},
		{"3g.40gb x1 + 1g.10gb x4", "1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3 3g.40gb@4", ""},
		{"4g.40gb x1 + 3g.40gb x1", "4g.40gb@0 3g.40gb@4", ""},
		{"3g.40gb x1 + 2g.20gb x2", "2g.20gb@0 2g.20gb@2 3g.40gb@4", ""},
		{"2g.20gb x3 + 1g.20gb x1", "2g.20gb@0 2g.20gb@2 2g.20gb@4 1g.20gb@6", ""},
		{"1g.20gb x4", "1g.20gb@0 1g.20gb@2 1g.20gb@4 1g.20gb@6", ""},
		{"1g.10gb+me x1 + 1g.10gb x6", "1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb+me@6", ""},
		{"3g.40gb x2 + 1g.10gb x1", "",
			"1g.10gb x1 needs placements at {0,1,2,3,4,5,6}; slices 0-3 are taken by 3g.40gb, slices 4-7 are taken by 3g.40gb; free memory slices: none"},
		{"4g.40gb x1 + 1g.20gb x2 + 1g.10gb x1", "",
			"1g.10gb x1 needs placements at {0,1,2,3,4,5,6}; slices 0-3 are taken by 4g.40gb, slices 4-5 are taken by 1g.20gb, slices 6-7 are taken by 1g.20gb; free memory slices: none"},
		{"1g.20gb x4 + 1g.10gb x1", "",
			"1g.10gb x1 needs placements at {0,1,2,3,4,5,6}; slices 0-1 are taken by 1g.20gb, slices 2-3 are taken by 1g.20gb, slices 4-5 are taken by 1g.20gb, slices 6-7 are taken by 1g.20gb; free memory slices: none"},
		{"4g.40gb x1 + 3g.40gb x1 + 1g.10gb x1", "",
			"the layout needs 8 compute slices (4g.40gb x1 + 3g.40gb x1 + 1g.10gb x1); this GPU has 7"},
		{"2g.20gb x4", "", "2g.20gb x4: this GPU holds at most 3 instances of 2g.20gb"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			plan, err := MakePlan(d.Profiles, nil, wants(tt.want))
			var nf *NoFitError
			switch {
			case tt.layout != "" && err != nil:
				t.Fatalf("MakePlan: %v", err)
			case tt.layout != "" && layout(plan) != tt.layout:
				t.Errorf("layout = %q, want %q", layout(plan), tt.layout)
			case tt.layout == "" && !errors.As(err, &nf):
				t.Fatalf("err = %v, want a NoFitError", err)
			case tt.layout == "" && nf.Message != tt.msg:
				t.Errorf("message =\n  %q\nwant\n  %q", nf.Message, tt.msg)
			}
		})
	}
}

func TestApplyOnAMockWithTheRealH100Profiles(t *testing.T) {
	ctx := context.Background()
	inv, d := realH100(t)
	s := nvmlmock.NewFromInventory(inv, d, 1)
	mock := s.GPUs[0]
	a := &Applier{GPU: gpu.NewNVML(s)}
	// The profile names come out of NVML's numbers exactly as on the real GPU.
	got, err := a.GPU.Device(ctx, mock.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Profiles, d.Profiles) {
		t.Fatalf("profiles read back through NVML differ from the recording:\n%+v\n%+v", got.Profiles, d.Profiles)
	}
	if _, err := a.Apply(ctx, mock.UUID, wants("3g.40gb x1 + 1g.10gb x4")); err != nil {
		t.Fatal(err)
	}
	if got := profilesOn(t, a.GPU, mock.UUID); !reflect.DeepEqual(got, []string{"1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"}) {
		t.Errorf("instances = %v", got)
	}
	want := []string{"SetMigMode(1)",
		"CreateGpuInstance(profile 9 at 4+4)", "CreateComputeInstance(GI 0)",
		"CreateGpuInstance(profile 19 at 0+1)", "CreateComputeInstance(GI 1)",
		"CreateGpuInstance(profile 19 at 1+1)", "CreateComputeInstance(GI 2)",
		"CreateGpuInstance(profile 19 at 2+1)", "CreateComputeInstance(GI 3)",
		"CreateGpuInstance(profile 19 at 3+1)", "CreateComputeInstance(GI 4)",
	}
	if calls := mock.Calls(); !reflect.DeepEqual(calls, want) {
		t.Errorf("NVML calls =\n  %q\nwant\n  %q", calls, want)
	}
}
