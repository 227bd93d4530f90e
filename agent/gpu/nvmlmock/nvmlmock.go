// Package nvmlmock extends go-nvml's mock DGX servers (dgxa100, dgxh100) with what the agent needs and
// they lack: compute mode, running processes, a pending MIG mode, MIG device handles, placement checks
// as the driver does them, and failure injection. Tests embed the mock and override its functions, so
// the agent's real NVML code path runs against it.
package nvmlmock

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Server is a mock DGX whose GPUs are GPU values.
type Server struct {
	*server.Server
	GPUs []*GPU
	// topo is how the GPUs are connected (topology.go); a DGX's unless a test sets another.
	topo topology
}

// GPU is one mock GPU with the agent's overrides.
type GPU struct {
	*server.Device

	mu sync.Mutex
	// processes are what GetComputeRunningProcesses reports.
	processes []nvml.ProcessInfo
	// procsUnsupported makes GetComputeRunningProcesses answer ERROR_NOT_SUPPORTED.
	procsUnsupported bool
	// computeMode is what GetComputeMode reports.
	computeMode nvml.ComputeMode
	// reserved is the driver's reserve GetMemoryInfo_v2 reports (0 unless SetMemoryReserved).
	reserved uint64
	// migCapable false makes MIG calls answer ERROR_NOT_SUPPORTED, as on a GPU without MIG.
	migCapable bool
	// current and pending are the MIG mode now and after a reset.
	current, pending int
	// needsReset makes SetMigMode change only the pending mode, as when the GPU cannot reset in place.
	needsReset bool
	// failCI fails the n-th CreateComputeInstance (1-based; 0 never) with ERROR_UNKNOWN.
	failCI, ciCreates int
	// calls records every mutating NVML call, so tests can assert that a pass changed nothing.
	calls []string
	// mutated, when set, is told every mutation that succeeded, after it took effect (persist.go).
	mutated func(g *GPU, call string)
	// usage is the MPS list, utilization samples and read failures (processes.go).
	usage usage
	// simulated is what the last host-process scan put on this GPU (hostprocs.go); nil before any.
	simulated []Process
}

// NewA100 returns a DGX A100 with n GPUs: A100-SXM4-40GB with NVIDIA's documented MIG profiles and
// placements (InventoryA100).
func NewA100(n int) *Server {
	inv, dev := mustInventory(InventoryA100)
	s := NewFromInventory(inv, dev, n)
	s.SetTopology(DGXTopology(12))
	return s
}

// NewH100 returns a DGX H100 with n GPUs: H100 80GB HBM3 with the MIG profiles and placements a real one
// reported through NVML (InventoryH100).
func NewH100(n int) *Server {
	inv, dev := mustInventory(InventoryH100)
	return NewFromInventory(inv, dev, n)
}

func wrap(s *server.Server, n int) *Server {
	if n < len(s.Devices) {
		s.Devices = s.Devices[:n]
	}
	out := &Server{Server: s}
	for i, d := range s.Devices {
		sd := d.(*server.Device)
		// Stable uuids make test output readable.
		sd.UUID = fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i)
		g := &GPU{Device: sd, migCapable: true}
		g.override()
		out.GPUs = append(out.GPUs, g)
		out.overrideTopology(i, g)
	}
	out.SetTopology(DGXTopology(18))
	return out
}

// SetProcesses sets the pids running on the GPU.
func (g *GPU) SetProcesses(pids ...uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.processes = nil
	for _, p := range pids {
		g.processes = append(g.processes, nvml.ProcessInfo{Pid: p, UsedGpuMemory: 1 << 30})
	}
}

// SetProcessMemory sets the device memory one running pid uses (added to the processes if absent),
// as GetComputeRunningProcesses reports it.
func (g *GPU) SetProcessMemory(pid uint32, used uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.processes {
		if g.processes[i].Pid == pid {
			g.processes[i].UsedGpuMemory = used
			return
		}
	}
	g.processes = append(g.processes, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: used})
}

// SetProcessesUnsupported makes GetComputeRunningProcesses answer ERROR_NOT_SUPPORTED (a driver or
// virtual GPU that cannot list processes) or, with false, the processes again.
func (g *GPU) SetProcessesUnsupported(v bool) { g.mu.Lock(); g.procsUnsupported = v; g.mu.Unlock() }

// SetMemoryReserved sets the driver's reserve GetMemoryInfo_v2 reports, as a real GPU reports one
// (hundreds of MiB); go-nvml's mock servers have no _v2 call.
func (g *GPU) SetMemoryReserved(bytes uint64) { g.mu.Lock(); g.reserved = bytes; g.mu.Unlock() }

// SetMIGCapable turns MIG support on or off.
func (g *GPU) SetMIGCapable(capable bool) { g.mu.Lock(); g.migCapable = capable; g.mu.Unlock() }

// SetMIGMode sets the current and pending MIG mode directly, as a previous boot left them.
func (g *GPU) SetMIGMode(current, pending bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.current, g.pending = b2i(current), b2i(pending)
}

// SetNeedsReset makes mode changes stay pending.
func (g *GPU) SetNeedsReset(v bool) { g.mu.Lock(); g.needsReset = v; g.mu.Unlock() }

// FailComputeInstanceCreate fails the n-th next CreateComputeInstance.
func (g *GPU) FailComputeInstanceCreate(n int) {
	g.mu.Lock()
	g.failCI, g.ciCreates = n, 0
	g.mu.Unlock()
}

// Calls returns and clears the mutating calls recorded so far.
func (g *GPU) Calls() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.calls
	g.calls = nil
	return c
}

func (g *GPU) record(format string, args ...any) {
	g.mu.Lock()
	g.calls = append(g.calls, fmt.Sprintf(format, args...))
	g.mu.Unlock()
}

func b2i(b bool) int {
	if b {
		return nvml.DEVICE_MIG_ENABLE
	}
	return nvml.DEVICE_MIG_DISABLE
}

func (g *GPU) override() {
	d := g.Device
	origProfileInfo := d.GetGpuInstanceProfileInfoFunc
	origCreate := d.CreateGpuInstanceWithPlacementFunc
	origInstances := d.GetGpuInstancesFunc

	// The total as GetMemoryInfo reports it, with the reserve SetMemoryReserved set.
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		m, r := d.GetMemoryInfo()
		if r != nvml.SUCCESS {
			return nvml.Memory_v2{}, r
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: m.Total, Reserved: g.reserved, Free: m.Free, Used: m.Used}, nvml.SUCCESS
	}
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.computeMode, nvml.SUCCESS
	}
	d.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
		g.record("SetComputeMode(%d)", m)
		g.mu.Lock()
		g.computeMode = m
		g.mu.Unlock()
		g.changed("SetComputeMode(%d)", m)
		return nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.procsUnsupported {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return append([]nvml.ProcessInfo(nil), g.processes...), nvml.SUCCESS
	}
	g.overrideUsage()
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.migCapable {
			return 0, 0, nvml.ERROR_NOT_SUPPORTED
		}
		return g.current, g.pending, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		g.record("SetMigMode(%d)", mode)
		g.mu.Lock()
		if !g.migCapable {
			g.mu.Unlock()
			return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
		}
		g.pending = mode
		activation := nvml.SUCCESS
		if g.needsReset {
			activation = nvml.ERROR_IN_USE
		} else {
			g.current = mode
		}
		g.mu.Unlock()
		g.changed("SetMigMode(%d)", mode)
		return nvml.SUCCESS, activation
	}
	d.GetGpuInstanceProfileInfoFunc = func(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if !g.isMIGCapable() {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return origProfileInfo(id)
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		g.record("CreateGpuInstance(profile %d at %d+%d)", info.Id, pl.Start, pl.Size)
		if r := g.checkPlacement(info, pl); r != nvml.SUCCESS {
			return nil, r
		}
		gi, r := origCreate(info, pl)
		if r != nvml.SUCCESS {
			return nil, r
		}
		sgi := gi.(*server.GpuInstance)
		g.overrideGI(sgi)
		g.changed("CreateGpuInstance(profile %d at %d+%d) = GI %d", info.Id, pl.Start, pl.Size, sgi.Info.Id)
		return gi, nvml.SUCCESS
	}
	// With MIG mode off the real GPU still answers both calls with SUCCESS (the H200's recording,
	// recordings/nvidia-h200.json, though nvml.h documents NOT_SUPPORTED): no instance exists and none
	// can be created until MIG mode is on, so the list is empty and the capacity nothing.
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if !g.isMIGCapable() {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if !g.migOn() {
			return nil, nvml.SUCCESS
		}
		return origInstances(info)
	}
	d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
		if !g.isMIGCapable() {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if !g.migOn() {
			return 0, nvml.SUCCESS
		}
		return g.remaining(info), nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		for gi := range d.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		migs := g.migDevices()
		if i < 0 || i >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[i], nvml.SUCCESS
	}
}

func (g *GPU) isMIGCapable() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.migCapable
}

func (g *GPU) migOn() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.migCapable && g.current == nvml.DEVICE_MIG_ENABLE
}

// remaining counts the placements of the profile no existing instance overlaps, at most the profile's
// instance count less those that exist.
func (g *GPU) remaining(info *nvml.GpuInstanceProfileInfo) int {
	possible, _ := g.Device.GetGpuInstancePossiblePlacementsFunc(info)
	g.Device.RLock()
	defer g.Device.RUnlock()
	free, same := 0, 0
	for gi := range g.Device.GpuInstances {
		if gi.Info.ProfileId == info.Id {
			same++
		}
	}
	for _, p := range possible {
		clash := false
		for gi := range g.Device.GpuInstances {
			o := gi.Info.Placement
			clash = clash || (p.Start < o.Start+o.Size && o.Start < p.Start+p.Size)
		}
		if !clash {
			free++
		}
	}
	return min(free, int(info.InstanceCount)-same)
}

// checkPlacement refuses what the driver refuses: MIG off, a placement NVML never offered for the
// profile, and a placement that overlaps an existing instance.
func (g *GPU) checkPlacement(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) nvml.Return {
	g.mu.Lock()
	current := g.current
	g.mu.Unlock()
	if current != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	possible, _ := g.Device.GetGpuInstancePossiblePlacementsFunc(info)
	offered := false
	for _, p := range possible {
		offered = offered || p == *pl
	}
	if !offered {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	g.Device.RLock()
	defer g.Device.RUnlock()
	for gi := range g.Device.GpuInstances {
		o := gi.Info.Placement
		if pl.Start < o.Start+o.Size && o.Start < pl.Start+pl.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	return nvml.SUCCESS
}

func (g *GPU) overrideGI(gi *server.GpuInstance) {
	origCreate := gi.CreateComputeInstanceFunc
	origDestroy := gi.DestroyFunc
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		g.record("CreateComputeInstance(GI %d)", gi.Info.Id)
		g.mu.Lock()
		g.ciCreates++
		fail := g.failCI != 0 && g.ciCreates == g.failCI
		g.mu.Unlock()
		if fail {
			return nil, nvml.ERROR_UNKNOWN
		}
		ci, r := origCreate(info)
		if r != nvml.SUCCESS {
			return nil, r
		}
		sci := ci.(*server.ComputeInstance)
		g.overrideCI(gi, sci)
		g.changed("CreateComputeInstance(GI %d) = CI %d", gi.Info.Id, sci.Info.Id)
		return ci, r
	}
	gi.DestroyFunc = func() nvml.Return {
		g.record("DestroyGpuInstance(%d)", gi.Info.Id)
		gi.RLock()
		busy := len(gi.ComputeInstances) > 0
		gi.RUnlock()
		if busy {
			return nvml.ERROR_IN_USE // as the driver: compute instances first
		}
		if r := origDestroy(); r != nvml.SUCCESS {
			return r
		}
		g.changed("DestroyGpuInstance(%d)", gi.Info.Id)
		return nvml.SUCCESS
	}
}

func (g *GPU) overrideCI(gi *server.GpuInstance, ci *server.ComputeInstance) {
	origDestroy := ci.DestroyFunc
	ci.DestroyFunc = func() nvml.Return {
		g.record("DestroyComputeInstance(GI %d CI %d)", gi.Info.Id, ci.Info.Id)
		if r := origDestroy(); r != nvml.SUCCESS {
			return r
		}
		g.changed("DestroyComputeInstance(GI %d CI %d)", gi.Info.Id, ci.Info.Id)
		return nvml.SUCCESS
	}
}

// changed tells the mutation hook, if any, what just took effect. It runs with no lock held: the hook
// reads the whole GPU.
func (g *GPU) changed(format string, args ...any) {
	g.mu.Lock()
	hook := g.mutated
	g.mu.Unlock()
	if hook != nil {
		hook(g, fmt.Sprintf(format, args...))
	}
}

// migDevices lists a MIG device handle per compute instance, ordered by GPU instance then CI id.
func (g *GPU) migDevices() []nvml.Device {
	type pair struct{ gi, ci uint32 }
	var pairs []pair
	g.Device.RLock()
	for gi := range g.Device.GpuInstances {
		gi.RLock()
		for ci := range gi.ComputeInstances {
			pairs = append(pairs, pair{gi.Info.Id, ci.Info.Id})
		}
		gi.RUnlock()
	}
	g.Device.RUnlock()
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].gi != pairs[j].gi {
			return pairs[i].gi < pairs[j].gi
		}
		return pairs[i].ci < pairs[j].ci
	})
	out := make([]nvml.Device, 0, len(pairs))
	for _, p := range pairs {
		p := p
		m := &mock.Device{}
		m.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(p.gi), nvml.SUCCESS }
		m.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(p.ci), nvml.SUCCESS }
		g.migProcesses(m, p.gi, p.ci)
		m.GetUUIDFunc = func() (string, nvml.Return) {
			// The whole GPU uuid: two GPUs of one node must not share MIG device uuids (the device plugin
			// would advertise one device for both; the real-node e2e caught that with a shorter prefix).
			return fmt.Sprintf("MIG-%s-gi%d-ci%d", strings.TrimPrefix(g.Device.UUID, "GPU-"), p.gi, p.ci), nvml.SUCCESS
		}
		out = append(out, m)
	}
	return out
}
