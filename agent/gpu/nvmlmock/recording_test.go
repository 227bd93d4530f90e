package nvmlmock

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// diffRecording asks the simulated GPU every call the recording made and lists where its answer differs.
func diffRecording(g *GPU, rec RecordedDevice) []string {
	var diffs []string
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
		key := fmt.Sprintf("nvmlDeviceGetGpuInstances(%d)", want.ID)
		if rec, ok := rec.MIGModeCalls[key]; ok {
			if _, r := g.Device.GetGpuInstances(&info); (r == nvml.SUCCESS) != (rec == "SUCCESS") {
				diffs = append(diffs, fmt.Sprintf("%s with MIG mode %v: %s, recorded %s", key, rec, r, rec))
			}
		}
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
			for i, p := range read.Profiles {
				if want := inv.Devices[0].Profiles; i < len(want) && p.Name != want[i].Name && want[i].Name != "" {
					t.Errorf("profile id %d reads as %s; NVML names it %s", p.ID, p.Name, want[i].Name)
				}
			}
		})
	}
}

// recordingOf writes an inventory as record.py would have recorded it (profile names included), for
// checking the comparison itself.
func recordingOf(d gpu.Device) RecordedDevice {
	rd := RecordedDevice{Product: d.Product, MemoryBytes: d.MemoryBytes, MIGModeCalls: map[string]string{}}
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
		rd.MIGModeCalls[fmt.Sprintf("nvmlDeviceGetGpuInstances(%d)", p.ID)] = "ERROR_NOT_SUPPORTED"
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
		"a call MIG mode has": func(r *RecordedDevice) { r.MIGModeCalls["nvmlDeviceGetGpuInstances(19)"] = "SUCCESS" },
	} {
		rec := recordingOf(dev)
		change(&rec)
		if d := diffRecording(s.GPUs[0], rec); len(d) == 0 {
			t.Errorf("%s changed in the recording: no difference found", name)
		}
	}
}
