package gpu

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// UsageReader reads what each GPU's processes use: their memory and their share of the SMs. It is
// apart from Interface because only the accounting (agent/accounting) reads it; *NVML and Null
// implement it.
type UsageReader interface {
	// Usage reads every GPU's processes and the utilization samples NVML took after since[uuid] (a
	// timestamp in NVML's microseconds; 0 asks for all NVML buffers). A GPU that cannot be read carries
	// its error in DeviceUsage.Err; the error returned is for the node (no NVML, no device count).
	Usage(ctx context.Context, since map[string]uint64) ([]DeviceUsage, error)
}

// memoryNotAvailable is NVML_VALUE_NOT_AVAILABLE: NVML lists the process but may not read its memory
// (a MIG GPU read without privileges, some vGPUs).
const memoryNotAvailable = ^uint64(0)

// ProcessUsage is one process with a compute context on a GPU, as NVML lists it.
type ProcessUsage struct {
	PID int32
	// UsedMemory is the device memory the process holds, in bytes; valid only when MemoryKnown.
	UsedMemory  uint64
	MemoryKnown bool
	// GIID and CIID are the MIG GPU and compute instance the process runs on; NoInstance (events.go) on a
	// whole GPU.
	GIID, CIID int
	// Instance is the MIG device's uuid where the process runs on one.
	Instance string
	// MPS says that NVML listed the process as a client of the GPU's MPS server.
	MPS bool
}

// UtilizationSample is NVML's per-process utilization over one of its sampling periods.
type UtilizationSample struct {
	PID int32
	// SM is the percent of the period the process had a kernel running on the SMs; Memory the percent
	// it read or wrote device memory.
	SM, Memory uint32
	// Timestamp is the end of the sample's period in NVML's microseconds since the epoch.
	Timestamp uint64
}

// DeviceUsage is one GPU's processes and utilization samples.
type DeviceUsage struct {
	UUID  string
	Index int
	// MemoryTotal and MemoryUsed are the device's, from GetMemoryInfo.
	MemoryTotal, MemoryUsed uint64
	// Processes is every compute process (MPS clients and the processes of every MIG instance included);
	// ProcessesRead false means the driver cannot list them and an empty list tells nothing.
	Processes     []ProcessUsage
	ProcessesRead bool
	// Samples are the utilization samples after the since timestamp asked for; SamplesRead false means
	// the GPU takes none (a MIG GPU, an older driver) and no utilization can be told.
	Samples     []UtilizationSample
	SamplesRead bool
	// Err is why the GPU could not be read; the other fields are then what was read before it.
	Err error
}

// usageRetries bounds the re-reads when a list grew between NVML's size query and its read.
const usageRetries = 3

// Usage implements UsageReader.
func (n *NVML) Usage(ctx context.Context, since map[string]uint64) ([]DeviceUsage, error) {
	count, r := n.lib.DeviceGetCount()
	if err := check("DeviceGetCount", r); err != nil {
		return nil, err
	}
	out := make([]DeviceUsage, 0, count)
	for i := 0; i < count; i++ {
		u := DeviceUsage{Index: i}
		h, r := n.lib.DeviceGetHandleByIndex(i)
		if err := check(fmt.Sprintf("DeviceGetHandleByIndex(%d)", i), r); err != nil {
			u.Err = err
			out = append(out, u)
			continue
		}
		if u.UUID, r = h.GetUUID(); r != nvml.SUCCESS {
			u.Err = check("GetUUID", r)
			out = append(out, u)
			continue
		}
		u.Err = n.deviceUsage(h, &u, since[u.UUID])
		out = append(out, u)
	}
	return out, nil
}

func (n *NVML) deviceUsage(h nvml.Device, u *DeviceUsage, since uint64) error {
	mem, r := h.GetMemoryInfo()
	if err := check("GetMemoryInfo", r); err != nil && !notSupported(err) {
		return err
	}
	u.MemoryTotal, u.MemoryUsed = mem.Total, mem.Used

	procs, err := processes(h)
	switch {
	case notSupported(err):
	case err != nil:
		return err
	default:
		u.ProcessesRead = true
		u.Processes = procs
	}
	if u.ProcessesRead {
		// MPS clients: drivers that list them only here (not in the compute list, which then shows the
		// MPS server) are covered, and a driver that lists them in both gets each pid once.
		mpsProcs, err := listProcesses(h.GetMPSComputeRunningProcesses)
		if err != nil && !notSupported(err) && !errors.Is(err, nvml.ERROR_FUNCTION_NOT_FOUND) {
			return fmt.Errorf("GetMPSComputeRunningProcesses: %w", err)
		}
		u.Processes = merge(u.Processes, mpsProcs, true)
		if err := n.migProcesses(h, u); err != nil {
			return err
		}
	}

	samples, err := utilization(h, since)
	switch {
	case notSupported(err):
	case err != nil:
		return err
	default:
		u.SamplesRead = true
		u.Samples = samples
	}
	return nil
}

// processes lists the GPU's compute processes.
func processes(h nvml.Device) ([]ProcessUsage, error) {
	ps, err := listProcesses(h.GetComputeRunningProcesses)
	if err != nil {
		return nil, fmt.Errorf("GetComputeRunningProcesses: %w", err)
	}
	return ps, nil
}

// listProcesses calls one of NVML's process lists, again when the list grew between go-nvml's size
// query and its read (INSUFFICIENT_SIZE).
func listProcesses(list func() ([]nvml.ProcessInfo, nvml.Return)) ([]ProcessUsage, error) {
	var infos []nvml.ProcessInfo
	r := nvml.ERROR_INSUFFICIENT_SIZE
	for try := 0; try < usageRetries && r == nvml.ERROR_INSUFFICIENT_SIZE; try++ {
		infos, r = list()
	}
	if err := check("process list", r); err != nil {
		return nil, err
	}
	out := make([]ProcessUsage, 0, len(infos))
	for _, p := range infos {
		pu := ProcessUsage{PID: int32(p.Pid), UsedMemory: p.UsedGpuMemory, MemoryKnown: p.UsedGpuMemory != memoryNotAvailable,
			GIID: instanceID(p.GpuInstanceId), CIID: instanceID(p.ComputeInstanceId)}
		if !pu.MemoryKnown {
			pu.UsedMemory = 0
		}
		out = append(out, pu)
	}
	return out, nil
}

// merge adds the processes of more not yet in ps (by pid); mps marks those of more as MPS clients.
func merge(ps, more []ProcessUsage, mps bool) []ProcessUsage {
	at := make(map[int32]int, len(ps))
	for i, p := range ps {
		at[p.PID] = i
	}
	for _, p := range more {
		p.MPS = mps
		if i, ok := at[p.PID]; ok {
			ps[i].MPS = ps[i].MPS || mps
			if !ps[i].MemoryKnown && p.MemoryKnown {
				ps[i].UsedMemory, ps[i].MemoryKnown = p.UsedMemory, true
			}
			if ps[i].GIID == NoInstance {
				ps[i].GIID, ps[i].CIID, ps[i].Instance = p.GIID, p.CIID, p.Instance
			}
			continue
		}
		at[p.PID] = len(ps)
		ps = append(ps, p)
	}
	return ps
}

// migProcesses names the MIG instance of each process on a MIG GPU and adds those that only the MIG
// device's own list shows. A GPU without MIG mode has nothing to add.
func (n *NVML) migProcesses(h nvml.Device, u *DeviceUsage) error {
	current, _, r := h.GetMigMode()
	if r != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
		return nil // not MIG-capable, or MIG off: processes run on the whole GPU
	}
	maxMigs, r := h.GetMaxMigDeviceCount()
	if err := check("GetMaxMigDeviceCount", r); err != nil {
		return err
	}
	byInstance := map[[2]int]string{}
	for i := 0; i < maxMigs; i++ {
		m, r := h.GetMigDeviceHandleByIndex(i)
		if r == nvml.ERROR_NOT_FOUND || r == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if err := check("GetMigDeviceHandleByIndex", r); err != nil {
			return err
		}
		uuid, r := m.GetUUID()
		if err := check("MIG GetUUID", r); err != nil {
			return err
		}
		gi, r1 := m.GetGpuInstanceId()
		ci, r2 := m.GetComputeInstanceId()
		if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS {
			byInstance[[2]int{gi, ci}] = uuid
		}
		ps, err := listProcesses(m.GetComputeRunningProcesses)
		if err != nil {
			if notSupported(err) {
				continue
			}
			return fmt.Errorf("MIG device %s: GetComputeRunningProcesses: %w", uuid, err)
		}
		for i := range ps {
			ps[i].GIID, ps[i].CIID, ps[i].Instance = gi, ci, uuid
		}
		u.Processes = merge(u.Processes, ps, false)
	}
	for i := range u.Processes {
		p := &u.Processes[i]
		if p.Instance == "" && p.GIID != NoInstance {
			p.Instance = byInstance[[2]int{p.GIID, p.CIID}]
		}
	}
	return nil
}

// utilization reads the samples after since. NVML answers NOT_FOUND when it took none since then (an
// idle GPU), which is no error, and INSUFFICIENT_SIZE when a process appeared between go-nvml's size
// query and its read, which a re-read settles.
func utilization(h nvml.Device, since uint64) ([]UtilizationSample, error) {
	var raw []nvml.ProcessUtilizationSample
	r := nvml.ERROR_INSUFFICIENT_SIZE
	for try := 0; try < usageRetries && r == nvml.ERROR_INSUFFICIENT_SIZE; try++ {
		raw, r = h.GetProcessUtilization(since)
	}
	if r == nvml.ERROR_NOT_FOUND {
		return nil, nil
	}
	if err := check("GetProcessUtilization", r); err != nil {
		return nil, err
	}
	out := make([]UtilizationSample, 0, len(raw))
	for _, s := range raw {
		if s.Pid == 0 || s.TimeStamp <= since {
			continue
		}
		out = append(out, UtilizationSample{PID: int32(s.Pid), SM: s.SmUtil, Memory: s.MemUtil, Timestamp: s.TimeStamp})
	}
	return out, nil
}

// Usage implements UsageReader: no NVML, nothing to read.
func (n Null) Usage(context.Context, map[string]uint64) ([]DeviceUsage, error) { return nil, n.err() }

var (
	_ UsageReader = (*NVML)(nil)
	_ UsageReader = Null{}
)
