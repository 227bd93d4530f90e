package nvmlmock

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// diffRecording asks the simulated GPU every call the recording made and lists where its answer differs.
func diffRecording(g *GPU, rec RecordedDevice) []string {
	var diffs []string
	asked := map[string]answer{}
	count, r := g.Device.GetMaxMigDeviceCount()
	asked["nvmlDeviceGetMaxMigDeviceCount"] = answer{count, r}
	for _, want := range rec.Profiles {
		info, r := g.Device.GetGpuInstanceProfileInfo(want.Type)
		if got := r.String(); (r == nvml.SUCCESS) != (want.Return == "SUCCESS") {
			diffs = append(diffs, fmt.Sprintf("type %d (%s): GetGpuInstanceProfileInfo %s, recorded %s", want.Type, want.TypeName, got, want.Return))
			continue
		}
		if r != nvml.SUCCESS {
			continue
		}
		got := fmt.Sprintf("id %d, %d slices, %d instances, %d MiB", info.Id, info.SliceCount, info.InstanceCount, info.MemorySizeMB)
		if rw := fmt.Sprintf("id %d, %d slices, %d instances, %d MiB", want.ID, want.SliceCount, want.InstanceCount, want.MemorySizeMB); got != rw {
			diffs = append(diffs, fmt.Sprintf("type %d: %s, recorded %s", want.Type, got, rw))
		}
		pls, r := g.Device.GetGpuInstancePossiblePlacements(&info)
		var gotPl []gpu.Placement
		for _, p := range pls {
			gotPl = append(gotPl, gpu.Placement{Start: int(p.Start), Size: int(p.Size)})
		}
		if (r == nvml.SUCCESS) != (want.PlacementsReturn == "SUCCESS") || !reflect.DeepEqual(gotPl, want.Placements) {
			diffs = append(diffs, fmt.Sprintf("type %d: placements %v (%s), recorded %v (%s)", want.Type, gotPl, r, want.Placements, want.PlacementsReturn))
		}
		gis, r := g.Device.GetGpuInstances(&info)
		asked[fmt.Sprintf("nvmlDeviceGetGpuInstances(%d)", want.ID)] = answer{len(gis), r}
		left, r := g.Device.GetGpuInstanceRemainingCapacity(&info)
		asked[fmt.Sprintf("nvmlDeviceGetGpuInstanceRemainingCapacity(%d)", want.ID)] = answer{left, r}
	}
	return append(diffs, diffMIGModeCalls(asked, rec)...)
}

// answer is one NVML call's return code and the count it returned.
type answer struct {
	value int
	r     nvml.Return
}

// diffMIGModeCalls compares the calls that need MIG mode with the recording: each recorded call's return
// code, and its count where the recording has one. A recorded call the comparison does not make is a
// difference too, so a recording never holds a call the mock is not checked on.
func diffMIGModeCalls(asked map[string]answer, rec RecordedDevice) []string {
	var diffs []string
	for call, want := range rec.MIGModeCalls {
		got, ok := asked[call]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s recorded (%s) but not asked of the simulated GPU", call, want))
		case got.r.String() != want:
			diffs = append(diffs, fmt.Sprintf("%s with MIG mode %s: %s, recorded %s", call, onOff(rec.MIGMode.Current), got.r, want))
		}
		if v, ok := rec.MIGModeValues[call]; ok && got.r == nvml.SUCCESS && got.value != v {
			diffs = append(diffs, fmt.Sprintf("%s with MIG mode %s: %d, recorded %d", call, onOff(rec.MIGMode.Current), got.value, v))
		}
	}
	sort.Strings(diffs)
	return diffs
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// diffNames lists the profiles the agent reads under another name than NVML gave them in the recording.
// The agent lists profiles smallest first, the recording by profile type: they are matched by id.
func diffNames(read, recorded []gpu.Profile) []string {
	var diffs []string
	named := map[int]string{}
	for _, p := range recorded {
		named[p.ID] = p.Name
	}
	for _, p := range read {
		if want, ok := named[p.ID]; !ok {
			diffs = append(diffs, fmt.Sprintf("profile id %d (%s) read, not in the recording", p.ID, p.Name))
		} else if p.Name != want && want != "" {
			diffs = append(diffs, fmt.Sprintf("profile id %d reads as %s; NVML names it %s", p.ID, p.Name, want))
		}
	}
	if len(read) != len(named) {
		diffs = append(diffs, fmt.Sprintf("%d profiles read, %d recorded", len(read), len(named)))
	}
	return diffs
}

// A simulated GPU must answer every NVML call the recording made as the real GPU did, and name its
// profiles (through the agent's NVML code and go-nvlib) as NVML itself named them.
func TestMockAnswersEqualTheRecordings(t *testing.T) {
	files := Recorded()
	if len(files) == 0 {
		t.Skip("no recording in recordings/: run test/gpu/mig/record.py on a GPU (recordings/README.md)")
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			rec, err := LoadRecording(file)
			if err != nil {
				t.Fatal(err)
			}
			inv := rec.Inventory()
			s := NewFromInventory(inv, inv.Devices[0], 1)
			s.GPUs[0].SetMIGMode(rec.Devices[0].MIGMode.Current, rec.Devices[0].MIGMode.Pending)
			for _, d := range diffRecording(s.GPUs[0], rec.Devices[0]) {
				t.Error(d)
			}
			read, err := gpu.NewNVML(s).Device(context.Background(), s.GPUs[0].UUID)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range diffNames(read.Profiles, inv.Devices[0].Profiles) {
				t.Error(d)
			}
		})
	}
}

// recordingOf writes an inventory as record.py would have recorded it (profile names included), for
// checking the comparison itself.
func recordingOf(d gpu.Device) RecordedDevice {
	rd := RecordedDevice{Product: d.Product, MemoryBytes: d.MemoryBytes,
		MIGModeCalls:  map[string]string{"nvmlDeviceGetMaxMigDeviceCount": "SUCCESS"},
		MIGModeValues: map[string]int{"nvmlDeviceGetMaxMigDeviceCount": 7}}
	byType := map[int]gpu.Profile{}
	for _, p := range d.Profiles {
		byType[p.Type] = p
	}
	for typ := 0; typ < nvml.GPU_INSTANCE_PROFILE_COUNT; typ++ {
		p, ok := byType[typ]
		if !ok {
			rd.Profiles = append(rd.Profiles, RecordedProfile{Type: typ, Return: "ERROR_NOT_SUPPORTED"})
			continue
		}
		rd.Profiles = append(rd.Profiles, RecordedProfile{Type: typ, Return: "SUCCESS", ID: uint32(p.ID), SliceCount: uint32(p.SliceCount),
			InstanceCount: uint32(p.MaxInstances), MemorySizeMB: p.MemoryMB, Name: "MIG " + p.Name, PlacementsReturn: "SUCCESS", Placements: p.Placements})
		rd.MIGModeCalls[fmt.Sprintf("nvmlDeviceGetGpuInstances(%d)", p.ID)] = "SUCCESS"
		rd.MIGModeCalls[fmt.Sprintf("nvmlDeviceGetGpuInstanceRemainingCapacity(%d)", p.ID)] = "SUCCESS"
	}
	return rd
}

func TestTheRecordingComparisonSeesEachDifference(t *testing.T) {
	_, dev := mustInventory(InventoryH100)
	s := NewH100(1)
	if d := diffRecording(s.GPUs[0], recordingOf(dev)); len(d) != 0 {
		t.Fatalf("the H100 inventory, as a recording, differs from the simulated H100: %v", d)
	}
	for name, change := range map[string]func(*RecordedDevice){
		"a placement":         func(r *RecordedDevice) { r.Profiles[2].Placements[1].Start = 3 },
		"a profile id":        func(r *RecordedDevice) { r.Profiles[0].ID = 99 },
		"a missing profile":   func(r *RecordedDevice) { r.Profiles[5].Return = "SUCCESS" },
		"memory":              func(r *RecordedDevice) { r.Profiles[4].MemorySizeMB++ },
		"a call MIG mode has": func(r *RecordedDevice) { r.MIGModeCalls["nvmlDeviceGetGpuInstances(19)"] = "ERROR_NOT_SUPPORTED" },
		"a capacity":          func(r *RecordedDevice) { r.MIGModeValues["nvmlDeviceGetGpuInstanceRemainingCapacity(9)"] = 2 },
		"an unasked call":     func(r *RecordedDevice) { r.MIGModeCalls["nvmlDeviceGetGpuInstances(99)"] = "SUCCESS" },
	} {
		rec := recordingOf(dev)
		change(&rec)
		if d := diffRecording(s.GPUs[0], rec); len(d) == 0 {
			t.Errorf("%s changed in the recording: no difference found", name)
		}
	}
}

func TestTheNameComparisonMatchesProfilesByID(t *testing.T) {
	_, dev := mustInventory(InventoryH100)
	reordered := slices.Clone(dev.Profiles)
	slices.Reverse(reordered)
	if d := diffNames(reordered, dev.Profiles); len(d) != 0 {
		t.Errorf("the same profiles in another order: %v", d)
	}
	renamed := slices.Clone(dev.Profiles)
	renamed[0].Name, renamed[1].Name = renamed[1].Name, renamed[0].Name
	if d := diffNames(renamed, dev.Profiles); len(d) != 2 {
		t.Errorf("two names swapped: %d differences %v, want 2", len(d), d)
	}
	if d := diffNames(dev.Profiles[1:], dev.Profiles); len(d) != 1 {
		t.Errorf("a profile not read: %d differences %v, want 1", len(d), d)
	}
}
