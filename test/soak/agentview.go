package soak

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// agentView is the agent's check for unmanaged processes over the soak's node, run as the agent runs it:
// every guard.CheckInterval the accounting reads NVML's processes (the stub driver's holdings), names
// their pods (the pod lookups, with their faults) and joins the scheduler's clients, and the guard's
// Unmanaged judges the read. A scheduler restart is an agent restart: the check starts anew.
type agentView struct {
	e *episode

	mu    sync.Mutex
	acct  *accounting.Accountant
	u     *guard.Unmanaged
	named map[key]bool

	stop, done chan struct{}
}

func newAgentView(e *episode) *agentView {
	a := &agentView{e: e}
	a.restarted()
	return a
}

// restarted starts the check anew, as a restarted agent does.
func (a *agentView) restarted() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acct = &accounting.Accountant{GPUs: stubUsage{hold: a.e.hold, uuids: a.e.uuids}, Pods: podNames{a.e.l},
		Shim: shimClients{a.e.s}}
	a.u = &guard.Unmanaged{}
	a.named = map[key]bool{}
}

func (a *agentView) start() {
	a.stop, a.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(a.done)
		t := time.NewTicker(guard.CheckInterval)
		defer t.Stop()
		for {
			a.pass()
			select {
			case <-a.stop:
				return
			case <-t.C:
			}
		}
	}()
}

func (a *agentView) stopRunning() { close(a.stop); <-a.done }

// pass is one read and judgement: every GPU of the soak is a shim GPU.
func (a *agentView) pass() {
	a.mu.Lock()
	acct, u := a.acct, a.u
	a.mu.Unlock()
	snap := acct.Sample(context.Background())
	kinds := map[string]guard.Kind{}
	for _, uuid := range a.e.uuids {
		kinds[uuid] = guard.KindShim
	}
	named := map[key]bool{}
	for uuid, v := range u.Judge(snap, kinds) {
		for _, p := range v.Named {
			named[key{uuid, p.PID}] = true
		}
	}
	a.mu.Lock()
	if a.u == u { // not restarted meanwhile
		a.named = named
	}
	a.mu.Unlock()
}

// isNamed says whether the last judgement named the process pid on gpu unmanaged.
func (a *agentView) isNamed(gpu string, pid int32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.named[key{gpu, pid}]
}

// stubUsage is NVML's process list over the stub driver's holdings (gpu.UsageReader).
type stubUsage struct {
	hold  string
	uuids []string
}

func (s stubUsage) Usage(context.Context, map[string]uint64) ([]gpu.DeviceUsage, error) {
	out := make([]gpu.DeviceUsage, len(s.uuids))
	for i, u := range s.uuids {
		out[i] = gpu.DeviceUsage{UUID: u, Index: i, ProcessesRead: true}
	}
	all, err := holdings(s.hold)
	if err != nil {
		return nil, err
	}
	for _, pid := range slices.Sorted(maps.Keys(all)) { // NVML lists processes in a stable order
		for d, b := range all[pid] {
			if d < len(out) {
				out[d].Processes = append(out[d].Processes, gpu.ProcessUsage{PID: pid, UsedMemory: uint64(b), MemoryKnown: true})
			}
		}
	}
	return out, nil
}

// podNames names pids through the soak's pod lookups (accounting.PodNamer): one lookup for the read,
// slow or failing as the lookups are.
type podNames struct{ l *lookups }

func (p podNames) Refs(_ context.Context, pids []int32) map[int32]podpid.Ref {
	found := p.l.findAll(pids)
	out := make(map[int32]podpid.Ref, len(found))
	for pid, pd := range found {
		out[pid] = podpid.Ref{Namespace: namespace, Name: pd.name, UID: "uid-" + pd.name, Container: "main"}
	}
	return out
}

// shimClients are the running scheduler's clients (accounting.ShimSource), as the agent's
// ShimSchedulers lists them.
type shimClients struct{ s *sched }

func (c shimClients) ShimClients(uuid string) []accounting.ShimClient {
	s := c.s.get()
	if s == nil {
		return nil
	}
	var out []accounting.ShimClient
	for _, cl := range s.Snapshot() {
		if cl.GPU == uuid {
			out = append(out, accounting.ShimClient{PID: cl.PID, LockWait: cl.WaitTime, LockHold: cl.HoldTime,
				SwappedBytes: cl.SwappedBytes, ResidentBytes: cl.ResidentBytes})
		}
	}
	return out
}
