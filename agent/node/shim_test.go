package node

import (
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/shimclient"
	"github.com/gpusharing/gpusharing/test/wait"
)

func oversubscribed(quantum time.Duration, budget string) v1alpha1.Sharing {
	o := &v1alpha1.Oversubscription{TimeQuantum: &metav1.Duration{Duration: quantum}, AntiThrashing: v1alpha1.AntiThrashingAuto}
	if budget != "" {
		q := resource.MustParse(budget)
		o.MemoryBudget = &q
	}
	return v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2, Interval: v1alpha1.TimeSliceDefault},
		Oversubscription: o}
}

func shimOf(t *testing.T, n *v1alpha1.GPUNode) *v1alpha1.ShimStatus {
	t.Helper()
	st := n.Status.GPUs[0]
	if c := cond(st.Conditions, v1alpha1.ConditionApplied); c != "True/AsDesired" {
		t.Fatalf("GPU 0 Applied = %s, want True/AsDesired", c)
	}
	return st.Applied.Shim
}

// The policy's oversubscription block reaches the GPU's scheduler: it listens where the device plugin
// points pods, enforces the quantum, budget and mode, changes them in place (clients keep their lease),
// publishes its clients, and stops (socket removed) when the GPU leaves oversubscription. A pass with
// nothing new writes nothing and leaves the scheduler alone.
func TestOversubscriptionRunsTheGPUsSchedulerFromThePolicyAndPublishesItsClients(t *testing.T) {
	a := newAgent(t, withNVML)
	root := withShimSchedulers(t, a, &ShimSchedulers{Reserve: DefaultOversubReserve, Headroom: DefaultOversubHeadroom})
	t.Cleanup(func() {
		for _, g := range a.server.GPUs {
			_ = a.r.Shim.Stop(t.Context(), g.UUID)
		}
	})
	uuid := a.server.GPUs[0].UUID
	sock := hostpath.SchedulerSocket(root, uuid)
	a.pass(t)

	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: oversubscribed(3*time.Second, "8Gi")})
	sh := shimOf(t, a.pass(t))
	if sh == nil || sh.TimeQuantum.Duration != 3*time.Second || sh.MemoryBudget.Value() != 8<<30 || sh.AntiThrashing != v1alpha1.AntiThrashingAuto || len(sh.Clients) != 0 {
		t.Fatalf("applied.shim = %+v, want quantum 3s, budget 8Gi, Auto, no clients", sh)
	}
	c := shimclient.Dial(t, sock, uuid)
	w := c.Welcome
	if w.QuantumMS != 3000 || w.Budget != 8<<30 || w.Mode != scheduler.ModeAuto {
		t.Errorf("the scheduler welcomes with quantum %d ms, budget %d, mode %s; want 3000, 8Gi, Auto", w.QuantumMS, w.Budget, w.Mode)
	}
	c.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	grant := c.Expect(scheduler.MsgGrant)

	n := a.pass(t)
	want := []v1alpha1.ShimClient{{PID: int32(os.Getpid()), Holding: true, Priority: "Normal"}}
	if got := shimOf(t, n).Clients; len(got) != 1 || got[0] != want[0] {
		t.Errorf("status clients = %+v, want %+v", got, want)
	}
	rv := n.ResourceVersion
	if n = a.pass(t); n.ResourceVersion != rv {
		t.Errorf("a pass with nothing new wrote status (resourceVersion %s -> %s)", rv, n.ResourceVersion)
	}

	// The launch bound the client reports in force, and its source, reach the status. The Pong to a Ping
	// sent behind the report says the scheduler handled it (one connection's messages in order).
	for _, r := range []struct {
		bound  uint32
		state  scheduler.PacingState
		source v1alpha1.LaunchBoundSource
	}{
		{4, scheduler.PacingScheduler, v1alpha1.LaunchBoundScheduler},
		{0, scheduler.PacingBackoff, v1alpha1.LaunchBoundBackoff},
		{16, scheduler.PacingOverride, v1alpha1.LaunchBoundOverride},
		{0, scheduler.PacingOff, v1alpha1.LaunchBoundOff},
	} {
		c.Send(scheduler.Message{Type: scheduler.MsgPacing, MaxQueued: r.bound, Pacing: r.state})
		c.Send(scheduler.Message{Type: scheduler.MsgPing, Seq: r.bound})
		c.Expect(scheduler.MsgPong)
		got := shimOf(t, a.pass(t)).Clients
		if len(got) != 1 || got[0].LaunchBound == nil || *got[0].LaunchBound != int64(r.bound) || got[0].LaunchBoundSource != r.source {
			t.Errorf("after the client reported bound %d (%s) status clients = %+v, want launchBound %d from %s",
				r.bound, r.state, got, r.bound, r.source)
		}
	}

	// A new quantum is changed in place: the client keeps its lease and its next grant carries it.
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: oversubscribed(5*time.Second, "8Gi")})
	if sh := shimOf(t, a.pass(t)); sh.TimeQuantum.Duration != 5*time.Second || len(sh.Clients) != 1 || !sh.Clients[0].Holding {
		t.Errorf("after the quantum change applied.shim = %+v, want quantum 5s and the client still holding", sh)
	}
	c.Send(scheduler.Message{Type: scheduler.MsgRelease, Epoch: grant.Epoch})
	c.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	if g := c.Expect(scheduler.MsgGrant); g.QuantumMS != 5000 {
		t.Errorf("the grant after the quantum change carries %d ms, want 5000", g.QuantumMS)
	}

	// Without a budget in the policy: the GPU's memory less what NVML sees outside the budget (nothing
	// here) and the headroom.
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: oversubscribed(5*time.Second, "")})
	n = a.pass(t)
	if got, want := shimOf(t, n).MemoryBudget.Value(), n.Status.GPUs[0].Memory.Value()-DefaultOversubHeadroom; got != want {
		t.Errorf("default budget = %d, want the GPU's memory less the 1Gi headroom = %d", got, want)
	}

	// Leaving oversubscription stops the scheduler: socket removed, the client's connection ends.
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing,
		TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2, Interval: v1alpha1.TimeSliceDefault}}})
	if sh := shimOf(t, a.pass(t)); sh != nil {
		t.Errorf("applied.shim = %+v after the GPU left oversubscription, want none", sh)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket %s after the scheduler stopped: %v, want it removed", sock, err)
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if m, err := scheduler.ReadMessage(c.Conn); err == nil {
		t.Errorf("the client's connection outlived the scheduler (read %s)", m.Type)
	}
	if fi, err := os.Stat(hostpath.SchedulerDir(root, uuid)); err != nil || !fi.IsDir() {
		t.Errorf("the GPU's scheduler directory is gone (%v): running pods mount it", err)
	}
}

// A budget the policy does not set is the GPU's memory less what NVML sees used outside it: all of a
// process that is not a client (a pod without the shim), a client's memory beyond its reservation (its
// CUDA context), rounded up to 256 MiB, and the headroom. It follows NVML pass by pass, ignores drift of
// one step, and falls back to the fixed reserve where NVML cannot list the processes or read their
// memory.
func TestDefaultBudgetIsTheGPUsMemoryLessWhatNVMLSeesOutsideIt(t *testing.T) {
	a := newAgent(t, withNVML)
	root := withShimSchedulers(t, a, &ShimSchedulers{Reserve: DefaultOversubReserve, Headroom: DefaultOversubHeadroom})
	g := a.server.GPUs[0]
	uuid := g.UUID
	t.Cleanup(func() { _ = a.r.Shim.Stop(t.Context(), uuid) })
	const gi, mi = uint64(1 << 30), uint64(1 << 20)
	budget := func(what string, want uint64) {
		t.Helper()
		n := a.pass(t)
		mem := uint64(n.Status.GPUs[0].Memory.Value())
		if got := uint64(shimOf(t, n).MemoryBudget.Value()); got != mem-want {
			t.Errorf("%s: budget = GPU memory - %d MiB, want GPU memory - %d MiB", what, (mem-got)/mi, want/mi)
		}
	}
	a.pass(t)
	g.SetProcessMemory(4242, 3*gi) // not a client: all of it is outside the budget
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: oversubscribed(time.Second, "")})
	budget("another process of 3 GiB", 3*gi+DefaultOversubHeadroom)

	// A client granted 2 GiB that NVML sees use 2 GiB + 300 MiB: only its context is outside.
	c := shimclient.Dial(t, hostpath.SchedulerSocket(root, uuid), uuid)
	c.Send(scheduler.Message{Type: scheduler.MsgAcquire, Need: 2 * gi})
	if gr := c.Expect(scheduler.MsgGrant); gr.Resident != 2*gi {
		t.Fatalf("grant reservation %d, want 2 GiB", gr.Resident)
	}
	g.SetProcessMemory(uint32(os.Getpid()), 2*gi+300*mi)
	budget("+ a client's context of 300 MiB (rounded up to 512)", 3*gi+512*mi+DefaultOversubHeadroom)

	// Drift of one step (the context grows to 2 GiB + 600 MiB: 768 MiB rounded) keeps the budget.
	g.SetProcessMemory(uint32(os.Getpid()), 2*gi+600*mi)
	budget("drift of one step", 3*gi+512*mi+DefaultOversubHeadroom)
	// The other process leaving is followed.
	g.SetProcesses(uint32(os.Getpid()))
	g.SetProcessMemory(uint32(os.Getpid()), 2*gi+300*mi)
	budget("the other process gone", 512*mi+DefaultOversubHeadroom)

	// NVML cannot read a process's memory, or cannot list processes: the fixed reserve.
	g.SetProcessMemory(4242, ^uint64(0))
	budget("a process's memory not available", DefaultOversubReserve)
	g.SetProcessMemory(4242, 3*gi)
	budget("readable again", 3*gi+512*mi+DefaultOversubHeadroom)
	g.SetProcessesUnsupported(true)
	budget("processes not supported", DefaultOversubReserve)
}

// Exclusive with oversubscription runs the scheduler too; strategies where the shim cannot run (MPS, MIG)
// stop it.
func TestExclusiveRunsTheGPUsSchedulerAndMPSStopsIt(t *testing.T) {
	a := newAgent(t, withNVML)
	root := withShimSchedulers(t, a, &ShimSchedulers{Reserve: DefaultOversubReserve})
	uuid := a.server.GPUs[0].UUID
	a.pass(t)
	excl := v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive, Oversubscription: &v1alpha1.Oversubscription{TimeQuantum: &metav1.Duration{Duration: time.Second}}}
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: excl})
	if sh := shimOf(t, a.pass(t)); sh == nil || sh.TimeQuantum.Duration != time.Second || !isSocket(hostpath.SchedulerSocket(root, uuid)) {
		t.Fatalf("Exclusive with oversubscription: applied.shim = %+v, socket present %v; want both", sh, isSocket(hostpath.SchedulerSocket(root, uuid)))
	}
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: mpsSharing(2, 50, "1Gi")})
	n := a.pass(t)
	if st := n.Status.GPUs[0]; st.Applied.Shim != nil || isSocket(hostpath.SchedulerSocket(root, uuid)) {
		t.Errorf("on MPS: applied.shim = %+v, socket present %v; want neither", st.Applied.Shim, isSocket(hostpath.SchedulerSocket(root, uuid)))
	}
	_ = a.r.MPS.Stop(t.Context(), uuid)
}

func TestSchedulerConfigFromThePolicy(t *testing.T) {
	s := &ShimSchedulers{Root: "/r", Reserve: 2 << 30}
	dev := gpu.Device{UUID: "GPU-a", MemoryBytes: 40 << 30}
	qty := func(v string) *resource.Quantity { q := resource.MustParse(v); return &q }
	tests := []struct {
		name    string
		dev     gpu.Device
		o       v1alpha1.Oversubscription
		quantum time.Duration
		budget  uint64
		mode    scheduler.Mode
	}{
		{"defaults: 20s, memory less the reserve, Auto", dev, v1alpha1.Oversubscription{}, 20 * time.Second, 38 << 30, scheduler.ModeAuto},
		{"the policy's settings", dev, v1alpha1.Oversubscription{TimeQuantum: &metav1.Duration{Duration: 3 * time.Second}, MemoryBudget: qty("8Gi"), AntiThrashing: v1alpha1.AntiThrashingAlways},
			3 * time.Second, 8 << 30, scheduler.ModeAlways},
		{"a budget above the GPU's memory is the GPU's memory", dev, v1alpha1.Oversubscription{MemoryBudget: qty("64Gi"), AntiThrashing: v1alpha1.AntiThrashingOff},
			20 * time.Second, 40 << 30, scheduler.ModeOff},
		{"a GPU no larger than the reserve gets the lock only", gpu.Device{UUID: "GPU-a", MemoryBytes: 2 << 30}, v1alpha1.Oversubscription{}, 20 * time.Second, 0, scheduler.ModeAuto},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := s.SchedulerConfig(tt.dev, tt.o, nil)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Quantum != tt.quantum || cfg.Budget != tt.budget || cfg.Mode != tt.mode || cfg.Grace != max(tt.quantum/2, scheduler.MinGrace) {
				t.Errorf("config = %+v, want quantum %v, budget %d, mode %s, default grace", cfg, tt.quantum, tt.budget, tt.mode)
			}
			if cfg.SocketPath != "/r/GPU-a/gpushare.sock" {
				t.Errorf("socket %q, want the hostpath layout /r/GPU-a/gpushare.sock", cfg.SocketPath)
			}
		})
	}
	if _, err := s.SchedulerConfig(dev, v1alpha1.Oversubscription{AntiThrashing: "Sometimes"}, nil); err == nil {
		t.Error("an unknown anti-thrashing mode was accepted")
	}
}

func TestShimStatusIsWhatTheSchedulerEnforces(t *testing.T) {
	got := shimStatus(ShimState{
		GPU: scheduler.GPUState{Quantum: 3 * time.Second, Budget: 8 << 30, Mode: scheduler.ModeAlways},
		Clients: []scheduler.ClientState{
			{PID: 7, Holding: true, Class: scheduler.ClassProduction, ResidentBytes: 5, SwappedBytes: 6, SwapOuts: 2, SwapIns: 1, HoldTime: time.Hour},
			{PID: 8},
		},
		Pods: map[int32]string{7: "ml/trainer-0"},
	})
	if got.TimeQuantum.Duration != 3*time.Second || got.MemoryBudget.Value() != 8<<30 || got.AntiThrashing != v1alpha1.AntiThrashingAlways {
		t.Errorf("settings = %+v, want 3s, 8Gi, Always", got)
	}
	want := []v1alpha1.ShimClient{
		{PID: 7, Pod: "ml/trainer-0", Holding: true, Priority: "High", ResidentBytes: 5, SwappedBytes: 6, SwapOuts: 2, SwapIns: 1},
		{PID: 8, Priority: "Normal"},
	}
	if len(got.Clients) != 2 || got.Clients[0] != want[0] || got.Clients[1] != want[1] {
		t.Errorf("clients = %+v, want %+v (times that grow every pass are left out)", got.Clients, want)
	}
	if lockOnly := shimStatus(ShimState{GPU: scheduler.GPUState{Quantum: time.Second}}); lockOnly.MemoryBudget != nil {
		t.Errorf("a lock-only scheduler reports memoryBudget %v, want none (the device plugin would turn swapping on)", lockOnly.MemoryBudget)
	}
}

// A crowded GPU must not push its GPUNode past etcd's size limit: clients are capped, holders and the
// largest residents first, and the rest counted.
func TestShimStatusListsAtMostMaxClientsAndCountsTheRest(t *testing.T) {
	var clients []scheduler.ClientState
	for pid := int32(1); pid <= 100; pid++ {
		clients = append(clients, scheduler.ClientState{PID: pid, ResidentBytes: uint64(pid) << 20, Holding: pid == 3})
	}
	got := shimStatus(ShimState{GPU: scheduler.GPUState{Quantum: time.Second}, Clients: clients})
	if len(got.Clients) != v1alpha1.MaxShimClientsInStatus || got.OmittedClients != int32(100-v1alpha1.MaxShimClientsInStatus) {
		t.Fatalf("%d clients listed, %d omitted; want %d and %d", len(got.Clients), got.OmittedClients, v1alpha1.MaxShimClientsInStatus, 100-v1alpha1.MaxShimClientsInStatus)
	}
	if got.Clients[0].PID != 3 || got.Clients[1].PID != 100 || got.Clients[len(got.Clients)-1].PID != 100-int32(v1alpha1.MaxShimClientsInStatus)+2 {
		t.Errorf("listed pids %d, %d ... %d; want the holder 3, then the largest residents from 100 down", got.Clients[0].PID, got.Clients[1].PID, got.Clients[len(got.Clients)-1].PID)
	}
	if few := shimStatus(ShimState{Clients: clients[:2]}); few.OmittedClients != 0 || len(few.Clients) != 2 {
		t.Errorf("two clients: %d listed, %d omitted", len(few.Clients), few.OmittedClients)
	}
}

// withShimSchedulers gives the agent sched with a fresh, short socket root (t.TempDir() paths can pass
// the 108-byte limit of a Unix socket path) and returns that root.
func withShimSchedulers(t *testing.T, a *agent, sched *ShimSchedulers) string {
	t.Helper()
	root, err := os.MkdirTemp("", "s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	sched.Root = root
	a.r.Shim = sched
	return root
}

// The policy's production classes reach the GPU's scheduler in place (a connected client keeps its lease),
// the status says they are in force and classes each client; leaving them classes no one.
func TestProductionClassesReconfigureTheSchedulerInPlace(t *testing.T) {
	a := newAgent(t, withNVML)
	root := withShimSchedulers(t, a, &ShimSchedulers{Reserve: DefaultOversubReserve, Headroom: DefaultOversubHeadroom})
	uuid := a.server.GPUs[0].UUID
	t.Cleanup(func() { _ = a.r.Shim.Stop(t.Context(), uuid) })
	a.pass(t)
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: oversubscribed(2*time.Second, "8Gi")})
	a.pass(t)
	c := shimclient.Dial(t, hostpath.SchedulerSocket(root, uuid), uuid)
	c.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	c.Expect(scheduler.MsgGrant)

	withQoS := oversubscribed(2*time.Second, "8Gi")
	withQoS.QoS = &v1alpha1.QoS{ProductionPriority: 1000, OpportunisticQueue: ptr.To[int32](4)}
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: withQoS})
	n := a.pass(t)
	st, ok := a.r.Shim.State(uuid)
	if !ok || st.GPU.ProductionPriority == nil || *st.GPU.ProductionPriority != 1000 || st.GPU.OpportunisticQueue != 4 {
		t.Fatalf("scheduler in force: %+v, want production priority 1000 and an opportunistic queue of 4", st.GPU)
	}
	g := n.Status.GPUs[0]
	if g.Applied.QoS == nil || g.Applied.QoS.ProductionPriority != 1000 {
		t.Errorf("applied.qos = %+v, want the policy's", g.Applied.QoS)
	}
	// A process of no pod is opportunistic; it kept its hold through the change.
	if cl := shimOf(t, n).Clients; len(cl) != 1 || !cl[0].Holding || cl[0].Class != v1alpha1.ClassOpportunistic {
		t.Errorf("status clients = %+v, want the one client, still holding, Opportunistic", cl)
	}

	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: oversubscribed(2*time.Second, "8Gi")})
	n = a.pass(t)
	if st, _ := a.r.Shim.State(uuid); st.GPU.ProductionPriority != nil {
		t.Errorf("production priority %d in force after the policy dropped qos", *st.GPU.ProductionPriority)
	}
	if g := n.Status.GPUs[0]; g.Applied.QoS != nil || shimOf(t, n).Clients[0].Class != "" {
		t.Errorf("after qos left: applied.qos %+v, client %+v; want neither classed", g.Applied.QoS, shimOf(t, n).Clients[0])
	}
}

// The GPUs' schedulers share one gang coordinator: one pod's clients on two GPUs, each connected to its
// GPU's scheduler, are one gang.
func TestGPUsSchedulersShareTheirGangs(t *testing.T) {
	root, err := os.MkdirTemp("", "s") // short: a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	pod := int32(os.Getpid()) // every client of this test runs in its process
	s := &ShimSchedulers{Root: root, Reserve: DefaultOversubReserve, Guards: scheduler.Guards{
		GangKey: func(pid int32) string {
			if pid == pod {
				return "pod:uid"
			}
			return ""
		}}}
	o := *oversubscribed(time.Second, "").Oversubscription
	for _, uuid := range []string{"GPU-a", "GPU-b"} {
		if err := s.Ensure(t.Context(), gpu.Device{UUID: uuid}, o, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Stop(t.Context(), uuid) })
	}
	a := shimclient.Dial(t, hostpath.SchedulerSocket(root, "GPU-a"), "GPU-a")
	shimclient.Dial(t, hostpath.SchedulerSocket(root, "GPU-b"), "GPU-b")
	a.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	a.Expect(scheduler.MsgGrant)
	// A client joins its gang right after its WELCOME is queued: the second may read its WELCOME first.
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		var got []string
		for _, uuid := range []string{"GPU-a", "GPU-b"} {
			st, ok := s.State(uuid)
			if !ok || len(st.Clients) != 1 || st.Clients[0].Gang != "pod:uid" {
				return false, fmt.Sprintf("GPU %s clients %+v, want one of gang pod:uid", uuid, st.Clients)
			}
			got = append(got, st.Clients[0].Gang)
		}
		return true, fmt.Sprint(got)
	}, "each GPU's client in gang pod:uid")
}

// A policy's opportunisticQueue reaches the scheduler as set, and an unset one as the scheduler's
// default, the value the API documents for it.
func TestSchedulerConfigTakesTheOpportunisticQueueOrTheDefault(t *testing.T) {
	s := &ShimSchedulers{Root: "/r", Reserve: 2 << 30}
	dev := gpu.Device{UUID: "GPU-a", MemoryBytes: 40 << 30}
	tests := []struct {
		name string
		qos  *v1alpha1.QoS
		want uint32
	}{
		{"unset: the scheduler's default", &v1alpha1.QoS{ProductionPriority: 1000}, scheduler.DefaultOpportunisticQueue},
		{"set: the policy's", &v1alpha1.QoS{ProductionPriority: 1000, OpportunisticQueue: ptr.To[int32](7)}, 7},
		{"no qos: the scheduler's default", nil, scheduler.DefaultOpportunisticQueue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := s.SchedulerConfig(dev, v1alpha1.Oversubscription{}, tt.qos)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OpportunisticQueue != tt.want {
				t.Errorf("opportunistic queue %d, want %d", cfg.OpportunisticQueue, tt.want)
			}
		})
	}
	// opportunisticQueueTime: unset is the scheduler's default, 0s the bound in launches alone.
	for _, tt := range []struct {
		name string
		set  *metav1.Duration
		want time.Duration
	}{
		{"queue time unset: the default", nil, scheduler.DefaultOpportunisticQueueTime},
		{"queue time set: the policy's", &metav1.Duration{Duration: 300 * time.Microsecond}, 300 * time.Microsecond},
		{"queue time 0s: off", &metav1.Duration{}, -1},
	} {
		cfg, err := s.SchedulerConfig(dev, v1alpha1.Oversubscription{}, &v1alpha1.QoS{ProductionPriority: 1000, OpportunisticQueueTime: tt.set})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OpportunisticQueueTime != tt.want {
			t.Errorf("%s: queue time %v, want %v", tt.name, cfg.OpportunisticQueueTime, tt.want)
		}
	}
	// settleFloor: unset is the scheduler's default, 0s no release on completion.
	for _, tt := range []struct {
		name string
		set  *metav1.Duration
		want time.Duration
	}{
		{"settle floor unset: the default", nil, scheduler.DefaultSettleFloor},
		{"settle floor set: the policy's", &metav1.Duration{Duration: 50 * time.Microsecond}, 50 * time.Microsecond},
		{"settle floor 0s: off", &metav1.Duration{}, -1},
	} {
		cfg, err := s.SchedulerConfig(dev, v1alpha1.Oversubscription{}, &v1alpha1.QoS{ProductionPriority: 1000, SettleFloor: tt.set})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.SettleFloor != tt.want {
			t.Errorf("%s: settle floor %v, want %v", tt.name, cfg.SettleFloor, tt.want)
		}
	}
	if scheduler.DefaultSettleFloor != 100*time.Microsecond {
		t.Errorf("scheduler.DefaultSettleFloor = %v, the API documents 100us", scheduler.DefaultSettleFloor)
	}
	// The API's documented defaults (sharing_types.go: "omitted: 3", "omitted: 500us") are these constants.
	if scheduler.DefaultOpportunisticQueueTime != 500*time.Microsecond {
		t.Errorf("scheduler.DefaultOpportunisticQueueTime = %v, the API documents 500us", scheduler.DefaultOpportunisticQueueTime)
	}
	if scheduler.DefaultOpportunisticQueue != 3 {
		t.Errorf("scheduler.DefaultOpportunisticQueue = %d, the API documents 3", scheduler.DefaultOpportunisticQueue)
	}
}
