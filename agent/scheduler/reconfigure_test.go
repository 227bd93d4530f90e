package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/wait"
)

func serveOne(t *testing.T, cfg GPUConfig, opts Options) *Scheduler {
	t.Helper()
	dir, err := os.MkdirTemp("", "s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.SocketPath = filepath.Join(dir, "g.sock")
	opts.GPUs = []GPUConfig{cfg}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestReconfigureChangesTheQuantumOfTheNextGrantAndKeepsTheConnection(t *testing.T) {
	s := serveOne(t, GPUConfig{UUID: "GPU-test", Quantum: 3 * time.Second, Budget: 8 << 30}, Options{})
	c := dialRaw(t, s.cfgs[0].SocketPath, ClassOpportunistic)
	c.send(Message{Type: MsgAcquire})
	g := c.expect(MsgGrant, 2*time.Second)
	if g.QuantumMS != 3000 {
		t.Fatalf("first grant carries quantum %d ms, want 3000", g.QuantumMS)
	}

	cfg := s.cfgs[0]
	cfg.Quantum, cfg.Grace, cfg.Budget, cfg.Mode = 5*time.Second, 0, 16<<30, ModeAlways
	if err := s.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	st := s.GPUs()[0]
	if st.Quantum != 5*time.Second || st.Grace != 2500*time.Millisecond || st.Budget != 16<<30 || st.Mode != ModeAlways {
		t.Errorf("GPU state after Reconfigure = %+v, want quantum 5s, default grace 2.5s, budget 16 GiB, Always", st)
	}
	c.send(Message{Type: MsgRelease, Epoch: g.Epoch})
	c.send(Message{Type: MsgAcquire})
	if g2 := c.expect(MsgGrant, 2*time.Second); g2.QuantumMS != 5000 {
		t.Errorf("grant after Reconfigure carries quantum %d ms, want 5000", g2.QuantumMS)
	}
	if n := len(s.Snapshot()); n != 1 {
		t.Errorf("%d clients after Reconfigure, want the one connected before it", n)
	}
	if err := s.Reconfigure(GPUConfig{UUID: "GPU-test", SocketPath: "/elsewhere.sock"}); err == nil {
		t.Error("Reconfigure moved a served socket")
	}
	if err := s.Reconfigure(GPUConfig{UUID: "GPU-other", SocketPath: cfg.SocketPath}); err == nil {
		t.Error("Reconfigure accepted a GPU the scheduler does not serve")
	}
}

// Clients set up their memory for one mode at hello; a flip between lock-only and a budget cannot be
// honoured for them, so they are dropped (and continue in pass-through).
func TestReconfigureBetweenNoBudgetAndABudgetDropsTheClients(t *testing.T) {
	s := serveOne(t, GPUConfig{UUID: "GPU-test", Quantum: time.Second}, Options{})
	c := dialRaw(t, s.cfgs[0].SocketPath, ClassOpportunistic)
	cfg := s.cfgs[0]
	cfg.Budget = 1 << 30
	if err := s.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	select {
	case m, ok := <-c.in:
		if ok {
			t.Fatalf("client kept its connection across a budget flip, read %s", m.Type)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("client kept its connection across a budget flip")
	}
}

func TestOnClientsChangeIsCalledOnConnectDisconnectAndANewLaunchBound(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	s := serveOne(t, GPUConfig{UUID: "GPU-test"}, Options{OnClientsChange: func(gpu string) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, gpu)
	}})
	n := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(calls)
	}
	c := dialRaw(t, s.cfgs[0].SocketPath, ClassOpportunistic)
	wait.Until(t, 5*time.Second, func() bool { return n() == 1 }, "a call on connect")
	// A launch bound reported in force calls once per change (the Pong behind each says it was handled).
	for i, r := range []Message{
		{Type: MsgPacing, MaxQueued: 4},
		{Type: MsgPacing, MaxQueued: 4},
		{Type: MsgPacing, Pacing: PacingBackoff},
	} {
		c.send(r)
		c.send(Message{Type: MsgPing, Seq: uint32(i)})
		c.expect(MsgPong, time.Second)
	}
	if got := n(); got != 3 {
		t.Errorf("%d calls after two distinct launch bounds reported (one twice), want 3", got)
	}
	c.conn.Close()
	wait.Until(t, 5*time.Second, func() bool { return n() == 4 }, "a call on disconnect")
	mu.Lock()
	defer mu.Unlock()
	for _, g := range calls {
		if g != "GPU-test" {
			t.Errorf("calls = %v, want the GPU's uuid each time", calls)
		}
	}
}

// The agent runs one Scheduler per GPU (and the demo several agents per process) on one registry:
// registering per Scheduler fails the second time, shared Metrics report every attached Scheduler.
func TestSchedulersSharingMetricsRegisterOnceAndReportEach(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-x", SocketPath: "/nonexistent/x.sock"}}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-y", SocketPath: "/nonexistent/y.sock"}}, Registerer: reg}); err == nil {
		t.Fatal("a second Scheduler registered the same series on one registry; sharing Metrics would be pointless")
	}

	reg = prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-a", SocketPath: "/nonexistent/a.sock", Budget: 1 << 30}}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-b", SocketPath: "/nonexistent/b.sock", Budget: 2 << 30}}, Metrics: m}); err != nil {
		t.Fatal(err)
	}
	budgets := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "gpusharing_scheduler_budget_bytes" {
				continue
			}
			for _, x := range mf.GetMetric() {
				out[x.GetLabel()[0].GetValue()] = x.GetGauge().GetValue()
			}
		}
		return out
	}
	if got := budgets(); got["GPU-a"] != 1<<30 || got["GPU-b"] != 2<<30 || len(got) != 2 {
		t.Errorf("budget series = %v, want GPU-a 1 GiB and GPU-b 2 GiB", got)
	}
	a.Close()
	if got := budgets(); len(got) != 1 || got["GPU-b"] != 2<<30 {
		t.Errorf("budget series after GPU-a's scheduler closed = %v, want GPU-b only", got)
	}
}
