package accounting

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

const gib = 1 << 30

// pods names pids from a fixed table, as podpid.Resolver does from cgroups and the API server.
type pods map[int32]podpid.Ref

func (p pods) Refs(_ context.Context, pids []int32) map[int32]podpid.Ref {
	out := map[int32]podpid.Ref{}
	for _, pid := range pids {
		if r, ok := p[pid]; ok {
			out[pid] = r
		}
	}
	return out
}

type shims map[string][]ShimClient

func (s shims) ShimClients(uuid string) []ShimClient { return s[uuid] }

func ref(ns, name, container string) podpid.Ref {
	return podpid.Ref{Namespace: ns, Name: name, Container: container, UID: ns + "-" + name}
}

func newAccountant(srv *nvmlmock.Server, p pods, s ShimSource) *Accountant {
	return &Accountant{GPUs: gpu.NewNVML(srv), Pods: p, Shim: s, Clock: clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))}
}

func container(t *testing.T, g GPU, name, c string) Container {
	t.Helper()
	for _, ct := range g.Containers {
		if ct.Name == name && ct.Container == c {
			return ct
		}
	}
	t.Fatalf("GPU %s: no container %s/%s in %+v", g.UUID, name, c, g.Containers)
	return Container{}
}

func TestAccountsEachPodOnASharedGPU(t *testing.T) {
	srv := nvmlmock.NewH100(2)
	g0 := srv.GPUs[0]
	// Two pods time-slice GPU 0; pid 300 is a host process outside any pod; pod b runs two processes.
	g0.SetUsage(nvmlmock.Proc(100, 3*gib, 60), nvmlmock.Proc(200, 1*gib, 20), nvmlmock.Proc(201, gib/2, 15), nvmlmock.Proc(300, gib/4, 0))
	g0.AdvanceSamples(1_000_000)
	a := newAccountant(srv, pods{100: ref("ml", "a", "train"), 200: ref("ml", "b", "serve"), 201: ref("ml", "b", "serve")}, nil)

	snap := a.Sample(context.Background())
	if snap.Err != nil || len(snap.GPUs) != 2 {
		t.Fatalf("snapshot: err %v, %d GPUs", snap.Err, len(snap.GPUs))
	}
	g, _ := snap.GPU(g0.UUID)
	if len(g.Processes) != 4 || !g.ProcessesRead || !g.UtilizationRead {
		t.Fatalf("GPU 0 = %+v", g)
	}
	ca, cb := container(t, g, "a", "train"), container(t, g, "b", "serve")
	if ca.MemoryBytes != 3*gib || ca.SMPercent != 60 || !ca.SMKnown || !ca.MemoryComplete {
		t.Errorf("pod a = %+v, want 3 GiB at 60%%", ca)
	}
	if cb.MemoryBytes != gib+gib/2 || cb.SMPercent != 35 || len(cb.PIDs) != 2 {
		t.Errorf("pod b = %+v, want 1.5 GiB at 35%% over two pids", cb)
	}
	if len(g.Containers) != 2 {
		t.Errorf("containers = %+v; the host process must not make one", g.Containers)
	}
	if want := time.UnixMicro(1_000_000); !ca.SampledAt.Equal(want) {
		t.Errorf("pod a sampled at %v, want NVML's sample time %v", ca.SampledAt, want)
	}

	// The next read takes only newer samples: a process that took none in the window was idle.
	g0.SetUsage(nvmlmock.Proc(100, 3*gib, 0), nvmlmock.Proc(200, 2*gib, 90))
	g0.AdvanceSamples(1_000_000)
	g, _ = a.Sample(context.Background()).GPU(g0.UUID)
	ca, cb = container(t, g, "a", "train"), container(t, g, "b", "serve")
	if ca.SMPercent != 0 || !ca.SMKnown || !ca.SampledAt.Equal(time.UnixMicro(1_000_000)) {
		t.Errorf("idle pod a = %+v, want 0%% since its last sample at 1 s", ca)
	}
	if cb.SMPercent != 90 || cb.MemoryBytes != 2*gib || len(cb.PIDs) != 1 {
		t.Errorf("pod b after pid 201 left = %+v", cb)
	}
	if latest, _ := a.Latest().GPU(g0.UUID); len(latest.Containers) != 2 {
		t.Errorf("Latest = %+v, want the last sample", latest)
	}
}

func TestAccountsMPSClientsThatOnlyTheMPSListShows(t *testing.T) {
	srv := nvmlmock.NewH100(1)
	g0 := srv.GPUs[0]
	client := func(pid uint32, mem uint64, sm uint32) nvmlmock.Process {
		p := nvmlmock.Proc(pid, mem, sm)
		p.MPS = true
		return p
	}
	// The compute list shows the MPS server (no pod); the clients appear in the MPS list only.
	g0.SetUsage(nvmlmock.Proc(50, gib/4, 0), client(100, 2*gib, 30), client(101, 4*gib, 40))
	g0.AdvanceSamples(500_000)
	a := newAccountant(srv, pods{100: ref("inf", "x", "c"), 101: ref("inf", "y", "c")}, nil)
	g := a.Sample(context.Background()).GPUs[0]
	if len(g.Processes) != 3 {
		t.Fatalf("processes = %+v, want the server and both clients", g.Processes)
	}
	for _, p := range g.Processes {
		if p.MPS != (p.PID != 50) {
			t.Errorf("pid %d MPS = %v", p.PID, p.MPS)
		}
	}
	if x := container(t, g, "x", "c"); x.MemoryBytes != 2*gib || x.SMPercent != 30 {
		t.Errorf("MPS client x = %+v", x)
	}
	if y := container(t, g, "y", "c"); y.MemoryBytes != 4*gib || y.SMPercent != 40 {
		t.Errorf("MPS client y = %+v", y)
	}
}

func TestAccountsProcessesOnMIGInstances(t *testing.T) {
	srv := nvmlmock.NewH100(1)
	g0 := srv.GPUs[0]
	n := gpu.NewNVML(srv)
	ctx := context.Background()
	if err := n.SetMIGMode(ctx, g0.UUID, true); err != nil {
		t.Fatal(err)
	}
	dev, err := n.Device(ctx, g0.UUID)
	if err != nil {
		t.Fatal(err)
	}
	prof, ok := dev.Profile("3g.40gb")
	if !ok {
		t.Fatalf("no 3g.40gb in %s", dev.ProfileNames())
	}
	var giIDs []int
	for _, pl := range prof.Placements {
		gi, err := n.CreateGPUInstance(ctx, g0.UUID, prof, pl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.CreateComputeInstance(ctx, g0.UUID, gi.GIID); err != nil {
			t.Fatal(err)
		}
		giIDs = append(giIDs, gi.GIID)
	}
	on := func(pid uint32, mem uint64, gi int) nvmlmock.Process {
		p := nvmlmock.Proc(pid, mem, 0)
		p.GI, p.CI = gi, 0
		return p
	}
	// A MIG GPU takes no per-process samples; its processes are listed per instance, and pid 101's
	// memory is unreadable (NVML_VALUE_NOT_AVAILABLE without privileges).
	g0.SetUtilizationUnsupported(true)
	hidden := on(101, 0, giIDs[1])
	hidden.NotAvailable = true
	g0.SetUsage(on(100, 5*gib, giIDs[0]), hidden)
	a := newAccountant(srv, pods{100: ref("ml", "a", "c"), 101: ref("ml", "b", "c")}, nil)
	g := a.Sample(ctx).GPUs[0]
	if g.Err != nil || g.UtilizationRead {
		t.Fatalf("GPU = %+v, want read without utilization", g)
	}
	dev, _ = n.Device(ctx, g0.UUID)
	want := map[int32]string{}
	for _, in := range dev.Instances {
		if in.GIID == giIDs[0] {
			want[100] = in.UUID
		}
		if in.GIID == giIDs[1] {
			want[101] = in.UUID
		}
	}
	for _, p := range g.Processes {
		if p.Instance == "" || p.Instance != want[p.PID] {
			t.Errorf("pid %d on instance %q, want %q", p.PID, p.Instance, want[p.PID])
		}
		if p.SMKnown {
			t.Errorf("pid %d claims an SM share on a GPU without samples", p.PID)
		}
	}
	if a := container(t, g, "a", "c"); a.MemoryBytes != 5*gib || !a.MemoryComplete || a.SMKnown {
		t.Errorf("pod a = %+v", a)
	}
	if b := container(t, g, "b", "c"); b.MemoryComplete {
		t.Errorf("pod b = %+v, want its memory marked incomplete", b)
	}
}

func TestOddHardwareNeverFailsTheRead(t *testing.T) {
	ctx := context.Background()
	t.Run("no process list", func(t *testing.T) {
		srv := nvmlmock.NewH100(1)
		srv.GPUs[0].SetProcessesUnsupported(true)
		g := newAccountant(srv, nil, nil).Sample(ctx).GPUs[0]
		if g.Err != nil || g.ProcessesRead || len(g.Processes) != 0 {
			t.Errorf("GPU = %+v, want read, without processes", g)
		}
	})
	t.Run("a list that grows while it is read", func(t *testing.T) {
		srv := nvmlmock.NewH100(1)
		srv.GPUs[0].SetUsage(nvmlmock.Proc(7, gib, 10))
		srv.GPUs[0].AdvanceSamples(1)
		srv.GPUs[0].GrowDuringRead(2)
		g := newAccountant(srv, nil, nil).Sample(ctx).GPUs[0]
		if g.Err != nil || len(g.Processes) != 1 || g.Processes[0].SMPercent != 10 {
			t.Errorf("GPU = %+v, want the re-read's process", g)
		}
	})
	t.Run("a list that keeps growing", func(t *testing.T) {
		srv := nvmlmock.NewH100(1)
		srv.GPUs[0].GrowDuringRead(100)
		g := newAccountant(srv, nil, nil).Sample(ctx).GPUs[0]
		if g.Err == nil {
			t.Errorf("GPU = %+v, want the GPU's error, not a hang", g)
		}
	})
	t.Run("a process that exits between the list and the samples", func(t *testing.T) {
		srv := nvmlmock.NewH100(1)
		g0 := srv.GPUs[0]
		g0.SetUsage(nvmlmock.Proc(7, gib, 10), nvmlmock.Proc(8, gib, 10))
		g0.AdvanceSamples(1)
		g0.VanishAfterList(8)
		g := newAccountant(srv, nil, nil).Sample(ctx).GPUs[0]
		if g.Err != nil || len(g.Processes) != 2 {
			t.Errorf("GPU = %+v, want both listed processes; the gone one has no sample", g)
		}
	})
	t.Run("no NVML", func(t *testing.T) {
		a := &Accountant{GPUs: gpu.Null{Cause: errors.New("libnvidia-ml.so.1: cannot open")}}
		if snap := a.Sample(ctx); !errors.Is(snap.Err, gpu.ErrUnavailable) || len(snap.GPUs) != 0 {
			t.Errorf("snapshot = %+v, want ErrUnavailable", snap)
		}
	})
}

func TestAccountsShimClientsLockAndSwap(t *testing.T) {
	srv := nvmlmock.NewH100(1)
	g0 := srv.GPUs[0]
	g0.SetUsage(nvmlmock.Proc(100, 2*gib, 50))
	g0.AdvanceSamples(1)
	s := shims{g0.UUID: {
		{PID: 100, LockWait: 3 * time.Second, LockHold: 7 * time.Second, SwappedBytes: gib, ResidentBytes: gib},
		// A lock-only client NVML does not list: it counts, its memory is none of NVML's.
		{PID: 101, LockWait: time.Second, LockHold: 2 * time.Second},
	}}
	a := newAccountant(srv, pods{100: ref("ml", "a", "c"), 101: ref("ml", "a", "c")}, s)
	g := a.Sample(context.Background()).GPUs[0]
	c := container(t, g, "a", "c")
	if c.Shim == nil || c.Shim.LockWait != 4*time.Second || c.Shim.LockHold != 9*time.Second || c.Shim.SwappedBytes != gib {
		t.Errorf("shim account = %+v", c.Shim)
	}
	if c.MemoryBytes != 2*gib || !c.MemoryComplete || len(c.PIDs) != 2 {
		t.Errorf("container = %+v", c)
	}
}
