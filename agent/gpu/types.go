// Package gpu is the agent's narrow view of the node's NVIDIA GPUs: an inventory snapshot and the few
// mutations the agent makes (MIG mode, MIG instances, compute mode). It is implemented over go-nvml
// (NVML) and by Null for nodes without GPUs or without a driver; the rest of the agent sees only this
// package, so the planners and appliers are tested against go-nvml's mock servers.
package gpu

import (
	"fmt"
	"strings"
)

// Placement is a range of memory slices a MIG GPU instance occupies, as NVML reports it.
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is one past the last memory slice.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps reports whether two placements share a memory slice.
func (p Placement) Overlaps(o Placement) bool { return p.Start < o.End() && o.Start < p.End() }

// String renders the slices as people count them: "4-7", or "3" for a single slice.
func (p Placement) String() string {
	if p.Size <= 1 {
		return fmt.Sprint(p.Start)
	}
	return fmt.Sprintf("%d-%d", p.Start, p.End()-1)
}

// Profile is one MIG GPU instance profile the GPU offers, read from NVML
// (GetGpuInstanceProfileInfo + GetGpuInstancePossiblePlacements).
type Profile struct {
	// Type is the profile kind NVML is asked about (GPU_INSTANCE_PROFILE_1_SLICE and so on), the
	// argument of GetGpuInstanceProfileInfo.
	Type int `json:"type"`
	// ID is the id NVML assigns the profile on this GPU, which its instances carry. It is not Type: on
	// an H100 80GB, 1g.10gb is type 0 but id 19, 3g.40gb type 2 but id 9.
	ID int `json:"id"`
	// Name is the profile as nvidia-smi prints it, for example 3g.40gb or 1g.10gb+me.
	Name string `json:"name"`
	// SliceCount is the number of compute slices.
	SliceCount int `json:"sliceCount"`
	// MemoryMB is the instance memory in MiB.
	MemoryMB uint64 `json:"memoryMB"`
	// MaxInstances is how many instances of this profile the GPU holds alone.
	MaxInstances int `json:"maxInstances"`
	// Placements are where an instance may sit.
	Placements []Placement `json:"placements"`
}

// Instance is one MIG GPU instance and, when it has one, its compute instance.
type Instance struct {
	// ProfileID and Profile name the GPU instance profile.
	ProfileID int    `json:"profileID"`
	Profile   string `json:"profile"`
	// Placement is where it sits.
	Placement Placement `json:"placement"`
	// GIID is NVML's GPU instance id.
	GIID int `json:"giID"`
	// CIID is the compute instance id, or NoComputeInstance when the GI has none (a create interrupted
	// between the GI and the CI).
	CIID int `json:"ciID"`
	// UUID is the MIG device's UUID, when it has a compute instance.
	UUID string `json:"uuid,omitempty"`
}

// NoMinor marks a GPU whose device node minor number NVML does not report.
const NoMinor = -1

// NoComputeInstance marks a GPU instance without a compute instance.
const NoComputeInstance = -1

// ComputeMode is NVML's compute mode, named as the API reports it.
type ComputeMode string

// Compute modes.
const (
	ComputeModeDefault          ComputeMode = "Default"
	ComputeModeExclusiveProcess ComputeMode = "ExclusiveProcess"
	ComputeModeProhibited       ComputeMode = "Prohibited"
	ComputeModeExclusiveThread  ComputeMode = "ExclusiveThread"
)

// MIGMode is the MIG mode now and after the next GPU reset.
type MIGMode struct {
	Current bool `json:"current"`
	Pending bool `json:"pending"`
}

// Process is one compute process on the GPU.
type Process struct {
	PID        int32  `json:"pid"`
	UsedMemory uint64 `json:"usedMemory"`
}

// Device is a snapshot of one physical GPU.
type Device struct {
	Index   int    `json:"index"`
	UUID    string `json:"uuid"`
	Product string `json:"product"`
	// Minor is the minor number of the GPU's device node /dev/nvidia<Minor> (NVML's GetMinorNumber);
	// NoMinor where NVML does not report it.
	Minor       int    `json:"minor"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// MemoryReservedBytes is the memory the driver keeps for itself (nvmlDeviceGetMemoryInfo_v2's
	// reserved), which no process can allocate; 0 where NVML does not report it.
	MemoryReservedBytes uint64      `json:"memoryReservedBytes,omitempty"`
	MIGCapable          bool        `json:"migCapable"`
	MIGMode             MIGMode     `json:"migMode"`
	ComputeMode         ComputeMode `json:"computeMode"`
	// Profiles are the MIG profiles the GPU offers, with placements; empty when not MIG-capable.
	Profiles []Profile `json:"profiles,omitempty"`
	// Instances are the MIG instances that exist; empty when MIG mode is off.
	Instances []Instance `json:"instances,omitempty"`
	// Processes are the compute processes running on the GPU (all its MIG instances included).
	Processes []Process `json:"processes,omitempty"`
	// ProcessesRead says that NVML listed the compute processes, so Processes is all of them (a
	// process's UsedMemory may still be NVML's "not available", all ones); false where the driver
	// does not support the list, and an empty Processes tells nothing.
	ProcessesRead bool `json:"-"`
}

// Profile returns the profile with the given name.
func (d Device) Profile(name string) (Profile, bool) {
	for _, p := range d.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// ProfileNames lists the offered profile names, for messages.
func (d Device) ProfileNames() string {
	names := make([]string, 0, len(d.Profiles))
	for _, p := range d.Profiles {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// PIDs lists the processes' pids.
func (d Device) PIDs() []int32 {
	pids := make([]int32, 0, len(d.Processes))
	for _, p := range d.Processes {
		pids = append(pids, p.PID)
	}
	return pids
}

// Inventory is a snapshot of the node's GPUs.
type Inventory struct {
	DriverVersion string   `json:"driverVersion"`
	CUDAVersion   string   `json:"cudaVersion"`
	Devices       []Device `json:"devices"`
}

// Device returns the device with the given uuid.
func (inv Inventory) Device(uuid string) (Device, bool) {
	for _, d := range inv.Devices {
		if d.UUID == uuid {
			return d, true
		}
	}
	return Device{}, false
}
