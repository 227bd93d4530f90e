package nvmlmock

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Process is one process on a mock GPU, as the accounting sees it through NVML.
type Process struct {
	PID uint32
	// Memory is its device memory in bytes; NotAvailable makes NVML report NVML_VALUE_NOT_AVAILABLE.
	Memory       uint64
	NotAvailable bool
	// MPS lists it as a client of the GPU's MPS server (GetMPSComputeRunningProcesses) rather than in
	// the compute list, as drivers that show the MPS server there do.
	MPS bool
	// GI and CI place it on a MIG instance; both -1 (or a zero Process built with Proc) on the whole GPU.
	GI, CI int
	// SM is the percent of each sampling period it keeps the SMs busy; 0 takes no sample.
	SM uint32
}

// Proc is a process on the whole GPU.
func Proc(pid uint32, memory uint64, sm uint32) Process {
	return Process{PID: pid, Memory: memory, GI: -1, CI: -1, SM: sm}
}

// usage is what the mock GPU says about its processes beyond the plain compute list.
type usage struct {
	procs []Process
	// sampleClock is NVML's time for utilization samples, in microseconds; each sample ends at it.
	sampleClock uint64
	// utilUnsupported makes GetProcessUtilization answer ERROR_NOT_SUPPORTED (a MIG GPU, an older driver).
	utilUnsupported bool
	// grow makes the next n process-list and utilization reads answer ERROR_INSUFFICIENT_SIZE, as when
	// a process starts between NVML's size query and its read.
	grow int
	// vanishAfterList drops these pids after the next compute list, so the utilization read that follows
	// sees processes already gone.
	vanishAfterList []uint32
}

// SetUsage replaces the GPU's processes (SetProcesses and SetProcessMemory edit the same list).
func (g *GPU) SetUsage(ps ...Process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.usage.procs = append([]Process(nil), ps...)
	g.processes = nil
	for _, p := range ps {
		if !p.MPS {
			g.processes = append(g.processes, p.info())
		}
	}
}

// AdvanceSamples moves NVML's sample clock by us microseconds: processes with an SM figure have a
// sample ending at the new time.
func (g *GPU) AdvanceSamples(us uint64) { g.mu.Lock(); g.usage.sampleClock += us; g.mu.Unlock() }

// SampleClock is NVML's sample time now, in microseconds.
func (g *GPU) SampleClock() uint64 { g.mu.Lock(); defer g.mu.Unlock(); return g.usage.sampleClock }

// SetUtilizationUnsupported makes per-process utilization answer ERROR_NOT_SUPPORTED.
func (g *GPU) SetUtilizationUnsupported(v bool) {
	g.mu.Lock()
	g.usage.utilUnsupported = v
	g.mu.Unlock()
}

// GrowDuringRead makes the next n list reads answer ERROR_INSUFFICIENT_SIZE.
func (g *GPU) GrowDuringRead(n int) { g.mu.Lock(); g.usage.grow = n; g.mu.Unlock() }

// VanishAfterList makes the pids exit right after the next compute-process list is read.
func (g *GPU) VanishAfterList(pids ...uint32) {
	g.mu.Lock()
	g.usage.vanishAfterList = pids
	g.mu.Unlock()
}

func (p Process) info() nvml.ProcessInfo {
	mem := p.Memory
	if p.NotAvailable {
		mem = ^uint64(0)
	}
	gi, ci := ^uint32(0), ^uint32(0)
	if p.GI >= 0 {
		gi, ci = uint32(p.GI), uint32(p.CI)
	}
	return nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: mem, GpuInstanceId: gi, ComputeInstanceId: ci}
}

// grown answers one injected ERROR_INSUFFICIENT_SIZE, if any are left; g.mu must be held.
func (g *GPU) grown() bool {
	if g.usage.grow > 0 {
		g.usage.grow--
		return true
	}
	return false
}

// overrideUsage adds the MPS list and per-process utilization, and makes the compute list honour the
// injected failures.
func (g *GPU) overrideUsage() {
	d := g.Device
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.procsUnsupported {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if g.grown() {
			return nil, nvml.ERROR_INSUFFICIENT_SIZE
		}
		out := append([]nvml.ProcessInfo(nil), g.processes...)
		g.vanish()
		return out, nvml.SUCCESS
	}
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		var out []nvml.ProcessInfo
		for _, p := range g.usage.procs {
			if p.MPS {
				out = append(out, p.info())
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.usage.utilUnsupported {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if g.grown() {
			return nil, nvml.ERROR_INSUFFICIENT_SIZE
		}
		var out []nvml.ProcessUtilizationSample
		if g.usage.sampleClock > since {
			for _, p := range g.usage.procs {
				if p.SM > 0 {
					out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, SmUtil: p.SM, TimeStamp: g.usage.sampleClock})
				}
			}
		}
		if len(out) == 0 {
			return nil, nvml.ERROR_NOT_FOUND // NVML's answer when no sample is newer than since
		}
		return out, nvml.SUCCESS
	}
}

// vanish ends the processes VanishAfterList named; g.mu must be held.
func (g *GPU) vanish() {
	if len(g.usage.vanishAfterList) == 0 {
		return
	}
	gone := map[uint32]bool{}
	for _, pid := range g.usage.vanishAfterList {
		gone[pid] = true
	}
	g.usage.vanishAfterList = nil
	keep := g.usage.procs[:0]
	for _, p := range g.usage.procs {
		if !gone[p.PID] {
			keep = append(keep, p)
		}
	}
	g.usage.procs = keep
	var infos []nvml.ProcessInfo
	for _, p := range g.processes {
		if !gone[p.Pid] {
			infos = append(infos, p)
		}
	}
	g.processes = infos
}

// migProcesses gives a MIG device handle the processes placed on its instance.
func (g *GPU) migProcesses(m *mock.Device, gi, ci uint32) {
	m.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		var out []nvml.ProcessInfo
		for _, p := range g.usage.procs {
			if p.GI == int(gi) && p.CI == int(ci) {
				out = append(out, p.info())
			}
		}
		return out, nvml.SUCCESS
	}
}
