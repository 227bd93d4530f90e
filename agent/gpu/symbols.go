package gpu

import (
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// go-nvml loads libnvidia-ml lazily: a call of a function the installed driver's library does not export
// ends the whole process ("symbol lookup error", exit 127), which no Return can report. An older driver
// lacks newer functions (nvmlDeviceGetMemoryInfo_v2 came with R510), so every function the agent calls
// that go-nvml does not already fall back for by version is looked up once, and a missing one answers
// ERROR_FUNCTION_NOT_FOUND instead of being called: the agent then reports what it could not read.
//
// deviceSymbols maps each nvml.Device method the agent calls to the library function it calls.
// Methods go-nvml versions itself (GetComputeRunningProcesses, GetGpuInstancePossiblePlacements,
// DeviceGetCount...) fall back to a version every driver has and are not listed.
var deviceSymbols = map[string]string{
	"GetIndex":                           "nvmlDeviceGetIndex",
	"GetUUID":                            "nvmlDeviceGetUUID",
	"GetName":                            "nvmlDeviceGetName",
	"GetMinorNumber":                     "nvmlDeviceGetMinorNumber",
	"GetMemoryInfo":                      "nvmlDeviceGetMemoryInfo",
	"GetMemoryInfo_v2":                   "nvmlDeviceGetMemoryInfo_v2",
	"GetComputeMode":                     "nvmlDeviceGetComputeMode",
	"SetComputeMode":                     "nvmlDeviceSetComputeMode",
	"GetMigMode":                         "nvmlDeviceGetMigMode",
	"SetMigMode":                         "nvmlDeviceSetMigMode",
	"GetMaxMigDeviceCount":               "nvmlDeviceGetMaxMigDeviceCount",
	"GetMigDeviceHandleByIndex":          "nvmlDeviceGetMigDeviceHandleByIndex",
	"GetDeviceHandleFromMigDeviceHandle": "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
	"GetGpuInstanceProfileInfo":          "nvmlDeviceGetGpuInstanceProfileInfo",
	"GetGpuInstances":                    "nvmlDeviceGetGpuInstances",
	"GetGpuInstanceById":                 "nvmlDeviceGetGpuInstanceById",
	"CreateGpuInstanceWithPlacement":     "nvmlDeviceCreateGpuInstanceWithPlacement",
	"GetProcessUtilization":              "nvmlDeviceGetProcessUtilization",
	"GetPciInfo":                         "nvmlDeviceGetPciInfo",
	"GetNvLinkState":                     "nvmlDeviceGetNvLinkState",
	"GetNvLinkRemotePciInfo":             "nvmlDeviceGetNvLinkRemotePciInfo",
	"GetTopologyCommonAncestor":          "nvmlDeviceGetTopologyCommonAncestor",
	"GetP2PStatus":                       "nvmlDeviceGetP2PStatus",
	"GetSupportedEventTypes":             "nvmlDeviceGetSupportedEventTypes",
	"RegisterEvents":                     "nvmlDeviceRegisterEvents",
}

// librarySymbols maps each library-level method the agent calls to its function.
var librarySymbols = map[string]string{
	"DeviceGetHandleByUUID":  "nvmlDeviceGetHandleByUUID",
	"SystemGetDriverVersion": "nvmlSystemGetDriverVersion",
	"EventSetCreate":         "nvmlEventSetCreate",
}

// missingSymbols returns the methods (of deviceSymbols and librarySymbols) whose library function lib
// lacks, sorted by function name. A library that cannot look symbols up (a mock without extensions)
// is taken to have them all.
func missingSymbols(lib nvml.Interface) (missing map[string]bool, names []string) {
	lookup := lookupOf(lib)
	if lookup == nil {
		return nil, nil
	}
	missing = map[string]bool{}
	for _, table := range []map[string]string{deviceSymbols, librarySymbols} {
		for method, sym := range table {
			if lookup(sym) != nil {
				missing[method] = true
				names = append(names, sym)
			}
		}
	}
	sort.Strings(names)
	return missing, names
}

// lookupOf is lib's symbol lookup, or nil where lib offers none. go-nvml's generated mocks panic when
// a method without a function is called, so the mock's Extensions is asked under recover.
func lookupOf(lib nvml.Interface) (lookup func(string) error) {
	defer func() {
		if recover() != nil {
			lookup = nil
		}
	}()
	ext := lib.Extensions()
	if ext == nil {
		return nil
	}
	return ext.LookupSymbol
}

// guardedLib is lib with the methods whose function is missing answering ERROR_FUNCTION_NOT_FOUND, and
// every device it hands out guarded the same way. It is used only where something is missing: with a
// complete library the agent calls go-nvml directly.
type guardedLib struct {
	nvml.Interface
	missing map[string]bool
}

func (l guardedLib) device(d nvml.Device, r nvml.Return) (nvml.Device, nvml.Return) {
	if r != nvml.SUCCESS || d == nil {
		return d, r
	}
	return guardedDevice{Device: d, missing: l.missing}, r
}

// DeviceGetHandleByIndex is versioned by go-nvml (v1 in every driver); only its device is guarded.
func (l guardedLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return l.device(l.Interface.DeviceGetHandleByIndex(i))
}

func (l guardedLib) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	if l.missing["DeviceGetHandleByUUID"] {
		return nil, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	return l.device(l.Interface.DeviceGetHandleByUUID(uuid))
}

func (l guardedLib) SystemGetDriverVersion() (string, nvml.Return) {
	if l.missing["SystemGetDriverVersion"] {
		return "", nvml.ERROR_FUNCTION_NOT_FOUND
	}
	return l.Interface.SystemGetDriverVersion()
}

func (l guardedLib) EventSetCreate() (nvml.EventSet, nvml.Return) {
	if l.missing["EventSetCreate"] {
		return nil, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	return l.Interface.EventSetCreate()
}
