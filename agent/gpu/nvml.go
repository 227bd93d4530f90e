package gpu

import (
	"context"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML implements Interface over an initialized go-nvml library (the real one, or a mock server).
type NVML struct {
	lib     nvml.Interface
	devlib  device.Interface
	missing []string
}

var _ Interface = (*NVML)(nil)

// NewNVML wraps an NVML library on which Init has already succeeded. Functions the library lacks (an
// older driver) are never called: they answer ERROR_FUNCTION_NOT_FOUND (symbols.go).
func NewNVML(lib nvml.Interface) *NVML {
	missing, names := missingSymbols(lib)
	if len(missing) > 0 {
		lib = guardedLib{Interface: lib, missing: missing}
	}
	return &NVML{lib: lib, devlib: device.New(lib, device.WithVerifySymbols(false)), missing: names}
}

// MissingFunctions names the NVML functions the agent uses that the loaded library lacks; what needs
// them is reported as unreadable or unsupported rather than called.
func (n *NVML) MissingFunctions() []string { return n.missing }

// Inventory implements Interface.
func (n *NVML) Inventory(ctx context.Context) (Inventory, error) {
	var inv Inventory
	driver, r := n.lib.SystemGetDriverVersion()
	if err := check("SystemGetDriverVersion", r); err != nil {
		return inv, err
	}
	cuda, r := n.lib.SystemGetCudaDriverVersion()
	if err := check("SystemGetCudaDriverVersion", r); err != nil {
		return inv, err
	}
	inv.DriverVersion = driver
	inv.CUDAVersion = fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10)

	count, r := n.lib.DeviceGetCount()
	if err := check("DeviceGetCount", r); err != nil {
		return inv, err
	}
	for i := 0; i < count; i++ {
		h, r := n.lib.DeviceGetHandleByIndex(i)
		if err := check(fmt.Sprintf("DeviceGetHandleByIndex(%d)", i), r); err != nil {
			return inv, err
		}
		d, err := n.snapshot(h)
		if err != nil {
			return inv, fmt.Errorf("GPU %d: %w", i, err)
		}
		inv.Devices = append(inv.Devices, d)
	}
	return inv, nil
}

// Device implements Interface.
func (n *NVML) Device(ctx context.Context, uuid string) (Device, error) {
	h, err := n.handle(uuid)
	if err != nil {
		return Device{}, err
	}
	return n.snapshot(h)
}

func (n *NVML) handle(uuid string) (nvml.Device, error) {
	h, r := n.lib.DeviceGetHandleByUUID(uuid)
	if r == nvml.ERROR_NOT_FOUND || r == nvml.ERROR_INVALID_ARGUMENT {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, uuid)
	}
	if err := check("DeviceGetHandleByUUID", r); err != nil {
		return nil, err
	}
	return h, nil
}

func (n *NVML) snapshot(h nvml.Device) (Device, error) {
	var d Device
	idx, r := h.GetIndex()
	if err := check("GetIndex", r); err != nil {
		return d, err
	}
	d.Index = idx
	if d.UUID, r = h.GetUUID(); r != nvml.SUCCESS {
		return d, check("GetUUID", r)
	}
	if d.Product, r = h.GetName(); r != nvml.SUCCESS {
		return d, check("GetName", r)
	}
	// The device node a container gets the GPU through; a driver without it leaves the GPU's shares
	// without a node, which prepare and Allocate then refuse with the reason.
	d.Minor = NoMinor
	if minor, r := h.GetMinorNumber(); r == nvml.SUCCESS {
		d.Minor = minor
	}
	mem, r := h.GetMemoryInfo()
	if err := check("GetMemoryInfo", r); err != nil {
		return d, err
	}
	d.MemoryBytes = mem.Total
	// The driver's reserve, which a sized GPU cannot offer claims; older drivers lack the call.
	if v2, r := h.GetMemoryInfo_v2(); r == nvml.SUCCESS && v2.Reserved < v2.Total {
		d.MemoryReservedBytes = v2.Reserved
	}

	mode, err := computeMode(h)
	if err != nil {
		return d, err
	}
	d.ComputeMode = mode

	current, pending, r := h.GetMigMode()
	switch err := check("GetMigMode", r); {
	case notSupported(err):
		// Not MIG-capable: no profiles, no instances.
	case err != nil:
		return d, err
	default:
		d.MIGCapable = true
		d.MIGMode = MIGMode{Current: current == nvml.DEVICE_MIG_ENABLE, Pending: pending == nvml.DEVICE_MIG_ENABLE}
		if d.Profiles, err = n.profiles(h, d.MemoryBytes); err != nil {
			return d, err
		}
		if d.MIGMode.Current {
			if d.Instances, err = n.instances(h, d.Profiles); err != nil {
				return d, err
			}
		}
	}

	procs, r := h.GetComputeRunningProcesses()
	if err := check("GetComputeRunningProcesses", r); err != nil && !notSupported(err) {
		return d, err
	}
	d.ProcessesRead = r == nvml.SUCCESS
	for _, p := range procs {
		d.Processes = append(d.Processes, Process{PID: int32(p.Pid), UsedMemory: p.UsedGpuMemory})
	}
	return d, nil
}

func computeMode(h nvml.Device) (ComputeMode, error) {
	m, r := h.GetComputeMode()
	if err := check("GetComputeMode", r); err != nil {
		return "", err
	}
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return ComputeModeDefault, nil
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return ComputeModeExclusiveProcess, nil
	case nvml.COMPUTEMODE_PROHIBITED:
		return ComputeModeProhibited, nil
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return ComputeModeExclusiveThread, nil
	}
	return "", fmt.Errorf("GetComputeMode: unknown compute mode %d", m)
}

// profiles reads every GPU instance profile NVML offers on this GPU, with its possible placements. The
// profile ids and placements differ between GPU models and drivers, so nothing here comes from a table.
func (n *NVML) profiles(h nvml.Device, memoryBytes uint64) ([]Profile, error) {
	var out []Profile
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, r := h.GetGpuInstanceProfileInfo(id)
		if r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if err := check(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", id), r); err != nil {
			return nil, err
		}
		placements, r := h.GetGpuInstancePossiblePlacements(&info)
		if err := check(fmt.Sprintf("GetGpuInstancePossiblePlacements(%d)", id), r); err != nil && !notSupported(err) {
			return nil, err
		}
		name, err := n.profileName(id, int(info.SliceCount), info.MemorySizeMB, memoryBytes)
		if err != nil {
			return nil, err
		}
		p := Profile{
			Type:         id,
			ID:           int(info.Id),
			Name:         name,
			SliceCount:   int(info.SliceCount),
			MemoryMB:     info.MemorySizeMB,
			MaxInstances: int(info.InstanceCount),
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, Placement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		sort.Slice(p.Placements, func(i, j int) bool { return p.Placements[i].Start < p.Placements[j].Start })
		out = append(out, p)
	}
	// Smallest first, as nvidia-smi lists them; NVML's id order puts +me variants at the end.
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].SliceCount != out[j].SliceCount {
			return out[i].SliceCount < out[j].SliceCount
		}
		if out[i].MemoryMB != out[j].MemoryMB {
			return out[i].MemoryMB < out[j].MemoryMB
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// computeProfileForSlices maps a GPU instance's compute slice count to the compute instance profile
// that spans all of it; the agent always creates one full-size compute instance per GPU instance.
var computeProfileForSlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// ComputeProfileForSlices returns the compute instance profile id that spans a GPU instance of the
// given compute slice count.
func ComputeProfileForSlices(slices int) (int, bool) {
	id, ok := computeProfileForSlices[slices]
	return id, ok
}

// profileName names a profile the way nvidia-smi does (go-nvlib's rounding of memory to the GPU's
// eighths), so 9856 MiB on an 80 GB GPU reads 1g.10gb.
func (n *NVML) profileName(giProfileID, slices int, memMB, deviceBytes uint64) (string, error) {
	ci, ok := computeProfileForSlices[slices]
	if !ok {
		return "", fmt.Errorf("GPU instance profile %d has %d slices, which no compute instance profile spans", giProfileID, slices)
	}
	p, err := n.devlib.NewMigProfile(giProfileID, ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, memMB, deviceBytes)
	if err != nil {
		return "", fmt.Errorf("naming GPU instance profile %d: %w", giProfileID, err)
	}
	return p.String(), nil
}

// instances lists the GPU instances that exist, each with its first compute instance and MIG device uuid.
func (n *NVML) instances(h nvml.Device, profiles []Profile) ([]Instance, error) {
	uuids, err := migUUIDs(h)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, p := range profiles {
		info, r := h.GetGpuInstanceProfileInfo(p.Type)
		if err := check(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", p.Type), r); err != nil {
			return nil, err
		}
		gis, r := h.GetGpuInstances(&info)
		if err := check(fmt.Sprintf("GetGpuInstances(%s)", p.Name), r); err != nil {
			return nil, err
		}
		for _, gi := range gis {
			giInfo, r := gi.GetInfo()
			if err := check("GpuInstance.GetInfo", r); err != nil {
				return nil, err
			}
			in := Instance{
				ProfileID: p.ID,
				Profile:   p.Name,
				Placement: Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
				GIID:      int(giInfo.Id),
				CIID:      NoComputeInstance,
			}
			ciID, err := firstComputeInstance(gi)
			if err != nil {
				return nil, err
			}
			if ciID != NoComputeInstance {
				in.CIID = ciID
				in.UUID = uuids[[2]int{in.GIID, ciID}]
			}
			out = append(out, in)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Placement.Start < out[j].Placement.Start })
	return out, nil
}

func firstComputeInstance(gi nvml.GpuInstance) (int, error) {
	best := NoComputeInstance
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, r := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if err := check("GetComputeInstanceProfileInfo", r); err != nil {
			return 0, err
		}
		cis, r := gi.GetComputeInstances(&info)
		if err := check("GetComputeInstances", r); err != nil {
			return 0, err
		}
		for _, ci := range cis {
			ciInfo, r := ci.GetInfo()
			if err := check("ComputeInstance.GetInfo", r); err != nil {
				return 0, err
			}
			if best == NoComputeInstance || int(ciInfo.Id) < best {
				best = int(ciInfo.Id)
			}
		}
	}
	return best, nil
}

// migUUIDs maps (GPU instance id, compute instance id) to the MIG device uuid.
func migUUIDs(h nvml.Device) (map[[2]int]string, error) {
	out := map[[2]int]string{}
	err := eachMIGDevice(h, func(mig nvml.Device, gi int) error {
		ci, r := mig.GetComputeInstanceId()
		if err := check("GetComputeInstanceId", r); err != nil {
			return err
		}
		uuid, r := mig.GetUUID()
		if err := check("MIG GetUUID", r); err != nil {
			return err
		}
		out[[2]int{gi, ci}] = uuid
		return nil
	})
	return out, err
}

// eachMIGDevice calls f with every MIG device handle of the GPU and its GPU instance id.
func eachMIGDevice(h nvml.Device, f func(mig nvml.Device, gi int) error) error {
	count, r := h.GetMaxMigDeviceCount()
	if err := check("GetMaxMigDeviceCount", r); err != nil {
		return err
	}
	for i := 0; i < count; i++ {
		mig, r := h.GetMigDeviceHandleByIndex(i)
		if r == nvml.ERROR_NOT_FOUND || r == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if err := check(fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", i), r); err != nil {
			return err
		}
		gi, r := mig.GetGpuInstanceId()
		if err := check("GetGpuInstanceId", r); err != nil {
			return err
		}
		if err := f(mig, gi); err != nil {
			return err
		}
	}
	return nil
}

// SetMIGMode implements Interface.
func (n *NVML) SetMIGMode(ctx context.Context, uuid string, enabled bool) error {
	h, err := n.handle(uuid)
	if err != nil {
		return err
	}
	mode := nvml.DEVICE_MIG_DISABLE
	if enabled {
		mode = nvml.DEVICE_MIG_ENABLE
	}
	// The activation status says whether a reset is still needed; the caller reads that from the next
	// snapshot's pending mode instead, so only the call's own result counts here.
	r, _ := h.SetMigMode(mode)
	return check(fmt.Sprintf("SetMigMode(%d)", mode), r)
}

// CreateGPUInstance implements Interface.
func (n *NVML) CreateGPUInstance(ctx context.Context, uuid string, profile Profile, at Placement) (Instance, error) {
	h, err := n.handle(uuid)
	if err != nil {
		return Instance{}, err
	}
	info, r := h.GetGpuInstanceProfileInfo(profile.Type)
	if err := check(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", profile.Type), r); err != nil {
		return Instance{}, err
	}
	pl := nvml.GpuInstancePlacement{Start: uint32(at.Start), Size: uint32(at.Size)}
	gi, r := h.CreateGpuInstanceWithPlacement(&info, &pl)
	if err := check(fmt.Sprintf("CreateGpuInstanceWithPlacement(%s at %s)", profile.Name, at), r); err != nil {
		return Instance{}, err
	}
	giInfo, r := gi.GetInfo()
	if err := check("GpuInstance.GetInfo", r); err != nil {
		return Instance{}, err
	}
	return Instance{
		ProfileID: int(giInfo.ProfileId),
		Profile:   profile.Name,
		Placement: Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
		GIID:      int(giInfo.Id),
		CIID:      NoComputeInstance,
	}, nil
}

// CreateComputeInstance implements Interface.
func (n *NVML) CreateComputeInstance(ctx context.Context, uuid string, giID int) (Instance, error) {
	h, err := n.handle(uuid)
	if err != nil {
		return Instance{}, err
	}
	gi, r := h.GetGpuInstanceById(giID)
	if err := check(fmt.Sprintf("GetGpuInstanceById(%d)", giID), r); err != nil {
		return Instance{}, err
	}
	giInfo, r := gi.GetInfo()
	if err := check("GpuInstance.GetInfo", r); err != nil {
		return Instance{}, err
	}
	pinfo, err := profileInfoByID(h, giInfo.ProfileId)
	if err != nil {
		return Instance{}, err
	}
	ciProfile, ok := computeProfileForSlices[int(pinfo.SliceCount)]
	if !ok {
		return Instance{}, fmt.Errorf("no compute instance profile spans %d slices", pinfo.SliceCount)
	}
	ciInfo, r := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if err := check(fmt.Sprintf("GetComputeInstanceProfileInfo(%d)", ciProfile), r); err != nil {
		return Instance{}, err
	}
	ci, r := gi.CreateComputeInstance(&ciInfo)
	if err := check(fmt.Sprintf("CreateComputeInstance(GI %d)", giID), r); err != nil {
		return Instance{}, err
	}
	got, r := ci.GetInfo()
	if err := check("ComputeInstance.GetInfo", r); err != nil {
		return Instance{}, err
	}
	return Instance{
		ProfileID: int(giInfo.ProfileId),
		Placement: Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
		GIID:      giID,
		CIID:      int(got.Id),
	}, nil
}

// profileInfoByID finds the profile whose NVML id an instance carries: instances report the id, but
// NVML is asked about profiles by type, and the two differ.
func profileInfoByID(h nvml.Device, id uint32) (nvml.GpuInstanceProfileInfo, error) {
	for typ := 0; typ < nvml.GPU_INSTANCE_PROFILE_COUNT; typ++ {
		info, r := h.GetGpuInstanceProfileInfo(typ)
		if r == nvml.SUCCESS && info.Id == id {
			return info, nil
		}
	}
	return nvml.GpuInstanceProfileInfo{}, fmt.Errorf("no GPU instance profile has id %d", id)
}

// DestroyInstance implements Interface.
func (n *NVML) DestroyInstance(ctx context.Context, uuid string, giID int) error {
	h, err := n.handle(uuid)
	if err != nil {
		return err
	}
	gi, r := h.GetGpuInstanceById(giID)
	if r == nvml.ERROR_NOT_FOUND {
		return nil // already gone: a restart after a destroy converges
	}
	if err := check(fmt.Sprintf("GetGpuInstanceById(%d)", giID), r); err != nil {
		return err
	}
	// NVML refuses to destroy a GPU instance that still has compute instances.
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, r := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r != nvml.SUCCESS {
			continue
		}
		cis, r := gi.GetComputeInstances(&info)
		if err := check("GetComputeInstances", r); err != nil {
			return err
		}
		for _, ci := range cis {
			if err := check(fmt.Sprintf("ComputeInstance.Destroy(GI %d)", giID), ci.Destroy()); err != nil {
				return err
			}
		}
	}
	return check(fmt.Sprintf("GpuInstance.Destroy(%d)", giID), gi.Destroy())
}

// SetComputeMode implements Interface.
func (n *NVML) SetComputeMode(ctx context.Context, uuid string, mode ComputeMode) error {
	h, err := n.handle(uuid)
	if err != nil {
		return err
	}
	m := map[ComputeMode]nvml.ComputeMode{
		ComputeModeDefault:          nvml.COMPUTEMODE_DEFAULT,
		ComputeModeExclusiveProcess: nvml.COMPUTEMODE_EXCLUSIVE_PROCESS,
		ComputeModeProhibited:       nvml.COMPUTEMODE_PROHIBITED,
	}[mode]
	return check(fmt.Sprintf("SetComputeMode(%s)", mode), h.SetComputeMode(m))
}
