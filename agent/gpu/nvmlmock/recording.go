package nvmlmock

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// Recordings are what test/gpu/mig/record.py read from a real GPU's NVML, profile type by profile type,
// with the return code of every call (recordings/README.md). A model with a recording is simulated from
// it (NewNode), and TestMockAnswersEqualTheRecordings pins that the mock answers NVML's calls as the GPU did.
//
//go:embed recordings
var recordings embed.FS

// Recording is one run of test/gpu/mig/record.py.
type Recording struct {
	RecordedBy    string           `json:"recordedBy"`
	DriverVersion string           `json:"driverVersion"`
	CUDAVersion   string           `json:"cudaVersion"`
	Devices       []RecordedDevice `json:"devices"`
}

// RecordedDevice is one GPU of a recording.
type RecordedDevice struct {
	Index       int    `json:"index"`
	Product     string `json:"product"`
	UUID        string `json:"uuid"`
	MemoryBytes uint64 `json:"memoryBytes"`
	MIGMode     struct {
		Return  string `json:"return"`
		Current bool   `json:"current"`
		Pending bool   `json:"pending"`
	} `json:"migMode"`
	Profiles []RecordedProfile `json:"profiles"`
	// MIGModeCalls are the return codes of the read-only calls that need MIG mode enabled.
	MIGModeCalls map[string]string `json:"migModeCalls"`
	// MIGModeValues are the counts those calls returned where they succeeded (instances, remaining
	// capacity, MIG devices); recordings made before record.py wrote them have none.
	MIGModeValues map[string]int `json:"migModeValues,omitempty"`
}

// RecordedProfile is NVML's answer for one GPU_INSTANCE_PROFILE_* type.
type RecordedProfile struct {
	Type             int             `json:"type"`
	TypeName         string          `json:"typeName"`
	Return           string          `json:"return"`
	ID               uint32          `json:"id"`
	SliceCount       uint32          `json:"sliceCount"`
	InstanceCount    uint32          `json:"instanceCount"`
	MemorySizeMB     uint64          `json:"memorySizeMB"`
	Name             string          `json:"name,omitempty"`
	PlacementsReturn string          `json:"placementsReturn,omitempty"`
	Placements       []gpu.Placement `json:"placements,omitempty"`
}

// Recorded lists the embedded recordings' file names, sorted.
func Recorded() []string {
	var out []string
	_ = fs.WalkDir(recordings, "recordings", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".json") {
			out = append(out, strings.TrimPrefix(path, "recordings/"))
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// LoadRecording reads an embedded recording by file name.
func LoadRecording(name string) (Recording, error) {
	var r Recording
	data, err := recordings.ReadFile("recordings/" + name)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("recording %s: %w", name, err)
	}
	if len(r.Devices) == 0 {
		return r, fmt.Errorf("recording %s holds no device", name)
	}
	return r, nil
}

// Inventory turns the recording's first GPU into the inventory NewFromInventory simulates: the profiles
// NVML answered with SUCCESS, named as NVML named them (without its "MIG " prefix).
func (r Recording) Inventory() gpu.Inventory {
	d := r.Devices[0]
	dev := gpu.Device{
		UUID: d.UUID, Product: d.Product, MemoryBytes: d.MemoryBytes, MIGCapable: d.MIGMode.Return == "SUCCESS",
		ComputeMode: gpu.ComputeModeDefault,
	}
	for _, p := range d.Profiles {
		if p.Return != "SUCCESS" {
			continue
		}
		dev.Profiles = append(dev.Profiles, gpu.Profile{
			Type: p.Type, ID: int(p.ID), Name: strings.TrimPrefix(p.Name, "MIG "), SliceCount: int(p.SliceCount),
			MemoryMB: p.MemorySizeMB, MaxInstances: int(p.InstanceCount), Placements: p.Placements,
		})
	}
	return gpu.Inventory{DriverVersion: r.DriverVersion, CUDAVersion: r.CUDAVersion, Devices: []gpu.Device{dev}}
}
