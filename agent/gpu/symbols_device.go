package gpu

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// guardedDevice is a device of a guardedLib: each method of deviceSymbols whose function the library
// lacks answers ERROR_FUNCTION_NOT_FOUND instead of calling it. go-nvml unwraps the embedded device
// where a method takes another device (GetTopologyCommonAncestor), and a guarded device passed as the other is unwrapped first (unguarded).
type guardedDevice struct {
	nvml.Device
	missing map[string]bool
}

const notFound = nvml.ERROR_FUNCTION_NOT_FOUND

func (d guardedDevice) guard(h nvml.Device, r nvml.Return) (nvml.Device, nvml.Return) {
	if r != nvml.SUCCESS || h == nil {
		return h, r
	}
	return guardedDevice{Device: h, missing: d.missing}, r
}

func (d guardedDevice) GetIndex() (int, nvml.Return) {
	if d.missing["GetIndex"] {
		return 0, notFound
	}
	return d.Device.GetIndex()
}

func (d guardedDevice) GetUUID() (string, nvml.Return) {
	if d.missing["GetUUID"] {
		return "", notFound
	}
	return d.Device.GetUUID()
}

func (d guardedDevice) GetName() (string, nvml.Return) {
	if d.missing["GetName"] {
		return "", notFound
	}
	return d.Device.GetName()
}

func (d guardedDevice) GetMinorNumber() (int, nvml.Return) {
	if d.missing["GetMinorNumber"] {
		return 0, notFound
	}
	return d.Device.GetMinorNumber()
}

func (d guardedDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if d.missing["GetMemoryInfo"] {
		return nvml.Memory{}, notFound
	}
	return d.Device.GetMemoryInfo()
}

func (d guardedDevice) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	if d.missing["GetMemoryInfo_v2"] {
		return nvml.Memory_v2{}, notFound
	}
	return d.Device.GetMemoryInfo_v2()
}

func (d guardedDevice) GetComputeMode() (nvml.ComputeMode, nvml.Return) {
	if d.missing["GetComputeMode"] {
		return 0, notFound
	}
	return d.Device.GetComputeMode()
}

func (d guardedDevice) SetComputeMode(m nvml.ComputeMode) nvml.Return {
	if d.missing["SetComputeMode"] {
		return notFound
	}
	return d.Device.SetComputeMode(m)
}

func (d guardedDevice) GetMigMode() (int, int, nvml.Return) {
	if d.missing["GetMigMode"] {
		return 0, 0, notFound
	}
	return d.Device.GetMigMode()
}

func (d guardedDevice) SetMigMode(m int) (nvml.Return, nvml.Return) {
	if d.missing["SetMigMode"] {
		return notFound, notFound
	}
	return d.Device.SetMigMode(m)
}

func (d guardedDevice) GetMaxMigDeviceCount() (int, nvml.Return) {
	if d.missing["GetMaxMigDeviceCount"] {
		return 0, notFound
	}
	return d.Device.GetMaxMigDeviceCount()
}

func (d guardedDevice) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if d.missing["GetMigDeviceHandleByIndex"] {
		return nil, notFound
	}
	return d.guard(d.Device.GetMigDeviceHandleByIndex(i))
}

func (d guardedDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	if d.missing["GetDeviceHandleFromMigDeviceHandle"] {
		return nil, notFound
	}
	return d.guard(d.Device.GetDeviceHandleFromMigDeviceHandle())
}

func (d guardedDevice) GetGpuInstanceProfileInfo(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if d.missing["GetGpuInstanceProfileInfo"] {
		return nvml.GpuInstanceProfileInfo{}, notFound
	}
	return d.Device.GetGpuInstanceProfileInfo(id)
}

func (d guardedDevice) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	if d.missing["GetGpuInstances"] {
		return nil, notFound
	}
	return d.Device.GetGpuInstances(info)
}

func (d guardedDevice) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	if d.missing["GetGpuInstanceById"] {
		return nil, notFound
	}
	return d.Device.GetGpuInstanceById(id)
}

func (d guardedDevice) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, p *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	if d.missing["CreateGpuInstanceWithPlacement"] {
		return nil, notFound
	}
	return d.Device.CreateGpuInstanceWithPlacement(info, p)
}

func (d guardedDevice) GetProcessUtilization(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	if d.missing["GetProcessUtilization"] {
		return nil, notFound
	}
	return d.Device.GetProcessUtilization(since)
}

func (d guardedDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	if d.missing["GetPciInfo"] {
		return nvml.PciInfo{}, notFound
	}
	return d.Device.GetPciInfo()
}

func (d guardedDevice) GetNvLinkState(link int) (nvml.EnableState, nvml.Return) {
	if d.missing["GetNvLinkState"] {
		return 0, notFound
	}
	return d.Device.GetNvLinkState(link)
}

func (d guardedDevice) GetNvLinkRemotePciInfo(link int) (nvml.PciInfo, nvml.Return) {
	if d.missing["GetNvLinkRemotePciInfo"] {
		return nvml.PciInfo{}, notFound
	}
	return d.Device.GetNvLinkRemotePciInfo(link)
}

func (d guardedDevice) GetTopologyCommonAncestor(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	if d.missing["GetTopologyCommonAncestor"] {
		return 0, notFound
	}
	return d.Device.GetTopologyCommonAncestor(unguarded(other))
}

func (d guardedDevice) GetP2PStatus(other nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
	if d.missing["GetP2PStatus"] {
		return 0, notFound
	}
	return d.Device.GetP2PStatus(unguarded(other), caps)
}

func (d guardedDevice) GetSupportedEventTypes() (uint64, nvml.Return) {
	if d.missing["GetSupportedEventTypes"] {
		return 0, notFound
	}
	return d.Device.GetSupportedEventTypes()
}

func (d guardedDevice) RegisterEvents(types uint64, set nvml.EventSet) nvml.Return {
	if d.missing["RegisterEvents"] {
		return notFound
	}
	return d.Device.RegisterEvents(types, set)
}

// unguarded is the device a guardedDevice wraps, for the methods that take a second device.
func unguarded(d nvml.Device) nvml.Device {
	if g, ok := d.(guardedDevice); ok {
		return g.Device
	}
	return d
}
