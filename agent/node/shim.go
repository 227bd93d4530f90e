package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const (
	// DefaultOversubReserve is the GPU memory left out of a budget the policy does not set, where NVML
	// cannot list the GPU's processes and their memory.
	DefaultOversubReserve = 2 << 30
	// DefaultOversubHeadroom is what a budget measured from NVML leaves free besides the memory it sees
	// outside the budget: the CUDA context of a process that does not show in NVML's list yet (about
	// 0.5 GiB on the H100) and drift between two passes.
	DefaultOversubHeadroom = 1 << 30
	// outsideStep rounds the memory seen outside the budget up, and is the least change of the budget a
	// pass applies: contexts and NVML's samples move by megabytes, and every budget change reconfigures
	// the scheduler.
	outsideStep = 256 << 20
)

// ShimSchedulers runs the shim's lock scheduler (agent/scheduler) of each GPU whose desired sharing has
// oversubscription, one Scheduler per GPU on hostpath.SchedulerSocket(Root, uuid), the socket the device
// plugin names in GPUSHARE_SOCKET. The GPUs' Schedulers share one scheduler.Gangs, so that a pod's
// clients on several GPUs take their turns together (scheduler/gang.go). A nil *ShimSchedulers runs none.
type ShimSchedulers struct {
	// Root holds one directory per GPU with its socket.
	Root string
	// Reserve is the GPU memory left out of a budget the policy does not set, where NVML cannot tell
	// what the GPU's processes use. CUDA contexts (about 0.5 GiB per process), lock-only clients,
	// other processes and memory the shim cannot swap (graph memory nodes, application-made pools,
	// managed memory) are not counted in the budget, so the budget must leave room for them or
	// swap-ins fail on a GPU the scheduler believes has room. Where NVML lists the processes and
	// their memory, the budget is instead the GPU's memory less what they use outside the budget
	// (outsideBudget) less Headroom, followed pass by pass.
	Reserve uint64
	// Headroom is what a budget measured from NVML leaves free on top (DefaultOversubHeadroom).
	Headroom uint64
	// Metrics are the schedulers' series, registered once per process; nil leaves them unregistered.
	Metrics *scheduler.Metrics
	// Clock drives every scheduler's quanta and grace; nil means the real clock.
	Clock scheduler.Clock
	// Notify is called when a GPU's clients connect or disconnect, so a pass publishes them; it must not block.
	Notify func()
	// Guards limit every scheduler's clients and check their claims (scheduler.Guards).
	Guards scheduler.Guards

	// refused counts the allocations each sized claim's ledger refused (refusals.go).
	refused refusalBook

	mu    sync.Mutex
	byGPU map[string]*scheduler.Scheduler
	gangs *scheduler.Gangs // the node's, shared by every GPU's Scheduler
}

// ShimState is one GPU's scheduler as observed: its settings in force and its clients.
type ShimState struct {
	GPU     scheduler.GPUState
	Clients []scheduler.ClientState
	// Pods names the pod ("namespace/name") of each client pid the agent could name.
	Pods map[int32]string
}

// SchedulerConfig is the scheduler a GPU gets from its policy's oversubscription block: the quantum
// (default 20s), the memory budget (the policy's, at most the GPU's memory; else the GPU's memory less
// what NVML sees its processes use outside the budget and the headroom, or less the fixed reserve where
// NVML cannot tell; 0, the lock only, when nothing is left) and the anti-thrashing mode.
func (s *ShimSchedulers) SchedulerConfig(dev gpu.Device, o v1alpha1.Oversubscription, qos *v1alpha1.QoS) (scheduler.GPUConfig, error) {
	cfg := scheduler.GPUConfig{UUID: dev.UUID, SocketPath: hostpath.SchedulerSocket(s.Root, dev.UUID), Quantum: scheduler.DefaultQuantum}
	if qos != nil {
		// The pods at or above the policy's threshold are production (scheduler/qos.go).
		p := qos.ProductionPriority
		cfg.ProductionPriority = &p
		if qos.OpportunisticQueue != nil {
			// Unset stays 0: WithDefaults gives it the scheduler's default, the one the API documents.
			cfg.OpportunisticQueue = uint32(*qos.OpportunisticQueue)
		}
		if t := qos.OpportunisticQueueTime; t != nil {
			// Unset stays 0 (the scheduler's default); 0s is the bound in launches alone, which the
			// scheduler's configuration says with a negative value.
			cfg.OpportunisticQueueTime = t.Duration
			if t.Duration <= 0 {
				cfg.OpportunisticQueueTime = -1
			}
		}
		if t := qos.SettleFloor; t != nil {
			// Likewise: unset is the scheduler's default, 0s no release on completion (negative there).
			cfg.SettleFloor = t.Duration
			if t.Duration <= 0 {
				cfg.SettleFloor = -1
			}
		}
	}
	if o.TimeQuantum != nil && o.TimeQuantum.Duration > 0 {
		cfg.Quantum = o.TimeQuantum.Duration
	}
	switch {
	case o.MemoryBudget != nil && o.MemoryBudget.Value() > 0:
		// More than the GPU has would make swap-ins fail instead of making clients wait.
		cfg.Budget = min(uint64(o.MemoryBudget.Value()), dev.MemoryBytes)
	default:
		reserve := s.Reserve
		if outside, ok := s.outsideBudget(dev); ok {
			reserve = outside + s.Headroom
		}
		if dev.MemoryBytes > reserve {
			cfg.Budget = s.steadyBudget(dev.UUID, dev.MemoryBytes-reserve)
		}
	}
	mode, err := scheduler.ParseMode(string(o.AntiThrashing))
	if err != nil {
		return cfg, fmt.Errorf("oversubscription.antiThrashing: %w", err)
	}
	cfg.Mode = mode
	return cfg.WithDefaults(), nil
}

// outsideBudget is the device memory NVML sees the GPU's processes use outside the scheduler's budget,
// rounded up to outsideStep: all of a process that is not a client of the GPU's scheduler (lock-only
// clients, pods without the shim, processes of the host), and of a client what it uses beyond its
// swappable memory (its CUDA context, memory the shim passes to the driver). A client's swappable
// memory is at most its reservation (the shim maps no more), or what it last reported resident where
// that is larger (a report not yet lowered). false where NVML cannot list the processes or read a
// process's memory: the caller falls back to the fixed reserve.
func (s *ShimSchedulers) outsideBudget(dev gpu.Device) (uint64, bool) {
	if !dev.ProcessesRead {
		return 0, false
	}
	own := map[int32]uint64{}
	s.mu.Lock()
	sch := s.byGPU[dev.UUID]
	s.mu.Unlock()
	if sch != nil {
		for _, c := range sch.Snapshot() {
			own[c.PID] += max(c.ReservedBytes, c.ResidentBytes)
		}
	}
	var outside uint64
	for _, p := range dev.Processes {
		if p.UsedMemory == ^uint64(0) { // NVML_VALUE_NOT_AVAILABLE: it may not read this process
			return 0, false
		}
		outside += p.UsedMemory - min(own[p.PID], p.UsedMemory)
	}
	return (outside + outsideStep - 1) / outsideStep * outsideStep, true
}

// steadyBudget keeps the running scheduler's budget where the measured one differs from it by one
// outsideStep at most, so that a figure sitting on a rounding boundary does not reconfigure every pass
// (the headroom covers the step).
func (s *ShimSchedulers) steadyBudget(uuid string, measured uint64) uint64 {
	s.mu.Lock()
	sch := s.byGPU[uuid]
	s.mu.Unlock()
	if sch == nil {
		return measured
	}
	cur := sch.GPUs()[0].Budget
	if cur > 0 && max(cur, measured)-min(cur, measured) <= outsideStep {
		return cur
	}
	return measured
}

// Ensure runs the GPU's scheduler with the settings of o. It asserts first: a running scheduler with
// these settings whose socket is in place costs nothing. Other settings are changed in place
// (Scheduler.Reconfigure), keeping every client's lease; a scheduler whose socket file is gone is
// restarted, since no client could reach it.
func (s *ShimSchedulers) Ensure(ctx context.Context, dev gpu.Device, o v1alpha1.Oversubscription, qos *v1alpha1.QoS) error {
	if s == nil {
		return errors.New("oversubscription needs the shim scheduler, which this agent does not run")
	}
	cfg, err := s.SchedulerConfig(dev, o, qos)
	if err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", dev.UUID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if sch := s.byGPU[dev.UUID]; sch != nil {
		if !isSocket(cfg.SocketPath) {
			log.Info("Restarting shim scheduler whose socket is gone", "socket", cfg.SocketPath)
			sch.Close()
			delete(s.byGPU, dev.UUID)
		} else {
			if st := sch.GPUs()[0]; sameSettings(st, cfg) {
				return nil
			}
			log.Info("Reconfiguring shim scheduler", "quantum", cfg.Quantum, "budget", cfg.Budget, "mode", cfg.Mode)
			return sch.Reconfigure(cfg)
		}
	}
	if err := os.MkdirAll(hostpath.SchedulerDir(s.Root, dev.UUID), 0o755); err != nil {
		return fmt.Errorf("creating the shim scheduler directory of GPU %s: %w", dev.UUID, err)
	}
	if s.gangs == nil {
		s.gangs = scheduler.NewGangs()
	}
	guards := s.Guards
	guards.OnChargeRefused = s.chargeRefused(s.Guards.OnChargeRefused)
	sch, err := scheduler.New(scheduler.Options{GPUs: []scheduler.GPUConfig{cfg}, Metrics: s.Metrics, Clock: s.Clock,
		OnClientsChange: func(string) { s.notify() }, Guards: guards, Gangs: s.gangs})
	if err != nil {
		return err
	}
	if err := sch.Listen(ctx); err != nil {
		return fmt.Errorf("starting the shim scheduler of GPU %s: %w", dev.UUID, err)
	}
	if s.byGPU == nil {
		s.byGPU = map[string]*scheduler.Scheduler{}
	}
	s.byGPU[dev.UUID] = sch
	log.Info("Started shim scheduler", "socket", cfg.SocketPath, "quantum", cfg.Quantum, "budget", cfg.Budget, "mode", cfg.Mode)
	return nil
}

// Stop ends the GPU's scheduler, if any, and removes its socket (a stale one an earlier agent left too).
// Its clients run without the lock and keep trying to reconnect (shim.md). The directory stays: running
// pods mount it, and a scheduler started later for the GPU must appear in it.
func (s *ShimSchedulers) Stop(ctx context.Context, uuid string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sock := hostpath.SchedulerSocket(s.Root, uuid)
	if sch := s.byGPU[uuid]; sch != nil {
		sch.Close() // removes the socket
		delete(s.byGPU, uuid)
		if s.Metrics != nil {
			s.Metrics.Forget(uuid)
		}
		logr.FromContextOrDiscard(ctx).Info("Stopped shim scheduler", "gpu", uuid)
	}
	if isSocket(sock) {
		if err := os.Remove(sock); err != nil {
			return fmt.Errorf("removing the stale shim scheduler socket of GPU %s: %w", uuid, err)
		}
	}
	return nil
}

// Satisfied says whether the GPU's scheduler runs with the settings of o and its socket is in place.
// A nil *ShimSchedulers runs none, so it is never satisfied (Ensure then says why).
func (s *ShimSchedulers) Satisfied(dev gpu.Device, o v1alpha1.Oversubscription, qos *v1alpha1.QoS) (bool, error) {
	if s == nil {
		return false, nil
	}
	cfg, err := s.SchedulerConfig(dev, o, qos)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	sch := s.byGPU[dev.UUID]
	s.mu.Unlock()
	return sch != nil && isSocket(cfg.SocketPath) && sameSettings(sch.GPUs()[0], cfg), nil
}

// State is the GPU's scheduler as it runs, or false when none runs.
func (s *ShimSchedulers) State(uuid string) (ShimState, bool) {
	if s == nil {
		return ShimState{}, false
	}
	s.mu.Lock()
	sch := s.byGPU[uuid]
	s.mu.Unlock()
	if sch == nil {
		return ShimState{}, false
	}
	return ShimState{GPU: sch.GPUs()[0], Clients: sch.Snapshot()}, true
}

// Run stops every scheduler when ctx ends (the agent stops): their sockets go; clients run without the lock
// and reconnect to the schedulers a restarted agent starts, re-announcing their memory (shim.md).
func (s *ShimSchedulers) Run(ctx context.Context) error {
	<-ctx.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for uuid, sch := range s.byGPU {
		sch.Close()
		delete(s.byGPU, uuid)
	}
	return nil
}

func (s *ShimSchedulers) notify() {
	if s.Notify != nil {
		s.Notify()
	}
}

// sameSettings compares what runs with cfg, which SchedulerConfig has defaulted.
func sameSettings(st scheduler.GPUState, cfg scheduler.GPUConfig) bool {
	return st.Quantum == cfg.Quantum && st.Grace == cfg.Grace && st.Budget == cfg.Budget && st.Mode == cfg.Mode &&
		ptr.Equal(st.ProductionPriority, cfg.ProductionPriority) && st.OpportunisticQueue == cfg.OpportunisticQueue &&
		st.OpportunisticQueueTime == max(cfg.OpportunisticQueueTime, 0) && st.SettleFloor == max(cfg.SettleFloor, 0)
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// shimStatus is status.gpus[].applied.shim from the scheduler's state: the settings it enforces and each
// client as it last reported.
func shimStatus(st ShimState) *v1alpha1.ShimStatus {
	out := &v1alpha1.ShimStatus{
		TimeQuantum:   &metav1.Duration{Duration: st.GPU.Quantum},
		AntiThrashing: v1alpha1.AntiThrashing(st.GPU.Mode.String()),
	}
	if st.GPU.Budget > 0 {
		out.MemoryBudget = resource.NewQuantity(int64(st.GPU.Budget), resource.BinarySI)
	}
	clients := slices.Clone(st.Clients)
	// The ones a reader looks for first: who holds the GPU, then who holds the most memory.
	slices.SortStableFunc(clients, func(a, b scheduler.ClientState) int {
		switch {
		case a.Holding != b.Holding:
			if a.Holding {
				return -1
			}
			return 1
		case a.ResidentBytes != b.ResidentBytes:
			return cmp.Compare(b.ResidentBytes, a.ResidentBytes)
		}
		return cmp.Compare(a.PID, b.PID)
	})
	if n := len(clients) - v1alpha1.MaxShimClientsInStatus; n > 0 {
		out.OmittedClients = int32(n)
		clients = clients[:v1alpha1.MaxShimClientsInStatus]
	}
	for _, c := range clients {
		sc := v1alpha1.ShimClient{
			PID:           c.PID,
			Pod:           st.Pods[c.PID],
			Holding:       c.Holding,
			Priority:      apiPriority(c.Class),
			Class:         shimClientClass(st.GPU, c.Class),
			ResidentBytes: int64(c.ResidentBytes),
			SwappedBytes:  int64(c.SwappedBytes),
			SwapOuts:      int64(c.SwapOuts),
			SwapIns:       int64(c.SwapIns),
		}
		if c.PacingKnown {
			sc.LaunchBound = ptr.To(int64(c.LaunchBound))
			sc.LaunchBoundSource = launchBoundSource(c.PacingState)
		}
		out.Clients = append(out.Clients, sc)
	}
	return out
}

// launchBoundSource names where a client's launch bound in force comes from, as the API spells it.
func launchBoundSource(p scheduler.PacingState) v1alpha1.LaunchBoundSource {
	switch p {
	case scheduler.PacingOverride:
		return v1alpha1.LaunchBoundOverride
	case scheduler.PacingBackoff:
		return v1alpha1.LaunchBoundBackoff
	case scheduler.PacingOff:
		return v1alpha1.LaunchBoundOff
	}
	return v1alpha1.LaunchBoundScheduler
}

// shimClientClass is a client's class on a GPU with production classes (the scheduler's High is
// production), empty elsewhere.
func shimClientClass(g scheduler.GPUState, p scheduler.Class) v1alpha1.WorkloadClass {
	switch {
	case g.ProductionPriority == nil:
		return ""
	case p == scheduler.ClassProduction:
		return v1alpha1.ClassProduction
	default:
		return v1alpha1.ClassOpportunistic
	}
}

// apiPriority is a client's class as status.applied.shim.clients[].priority has always named it: High
// for production, Normal for opportunistic (the wire's names; class says Production or Opportunistic).
func apiPriority(c scheduler.Class) string {
	if c == scheduler.ClassProduction {
		return "High"
	}
	return "Normal"
}
