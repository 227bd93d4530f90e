package scheduler

import (
	"os"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// memcheckEnv serves a 64 MiB budget whose process memory comes from a go-nvml mock GPU, through the
// same adapter the agent uses; this test process is the shim client NVML sees.
func memcheckEnv(t *testing.T) (*Scheduler, string, *Metrics, *nvmlmock.GPU) {
	t.Helper()
	srv := nvmlmock.NewA100(1)
	mock := srv.GPUs[0]
	read := ProcessMemoryFrom(gpu.NewNVML(srv))
	s, sock, m := startGuarded(t, GPUConfig{Quantum: 10 * time.Second, Budget: 64 * mib}, Guards{
		ProcessMemory:   func(string) (map[int32]uint64, error) { return read(mock.UUID) },
		ContextOverhead: 8 * mib,
	})
	return s, sock, m, mock
}

// holdAndReport takes the GPU with need bytes, reports them resident, then releases saying resident.
func holdAndRelease(t *testing.T, s *Scheduler, sock string, need, released uint64) ClientState {
	t.Helper()
	c := dialRaw(t, sock, ClassOpportunistic)
	c.send(Message{Type: MsgAcquire, Need: need})
	g := c.expect(MsgGrant, 2*time.Second)
	c.send(Message{Type: MsgUsage, Acks: 1, Need: need, Resident: need})
	c.send(Message{Type: MsgRelease, Epoch: g.Epoch, Resident: released})
	var st ClientState
	wait.Until(t, 2*time.Second, func() bool {
		snap := s.Snapshot()
		if len(snap) != 1 {
			return false
		}
		st = snap[0]
		return !st.Holding
	}, "the release is handled")
	return st
}

// A client that says it freed everything while NVML sees it hold 40 MiB (plus its context) keeps a
// 40 MiB reservation, so the budget is not handed out twice. Without the cross-check it dropped to 0.
func TestUnderReportedResidencyIsAccountedAtWhatNVMLSees(t *testing.T) {
	s, sock, m, mock := memcheckEnv(t)
	mock.SetProcessMemory(uint32(os.Getpid()), 48*mib) // 40 MiB of allocations + 8 MiB context
	st := holdAndRelease(t, s, sock, 40*mib, 0)
	if st.ReservedBytes != 40*mib {
		t.Fatalf("reserved after an under-reported release = %d MiB, want 40 (NVML's figure less the context)", st.ReservedBytes/mib)
	}
	if v := prom.CounterValue(t, m.underReports.WithLabelValues("GPU-test")); v < 1 {
		t.Fatalf("under-reports counted = %v", v)
	}
}

// An honest report is taken as it is: NVML's figure less the context is no more than it says.
func TestHonestResidencyIsTakenAsReported(t *testing.T) {
	s, sock, m, mock := memcheckEnv(t)
	mock.SetProcessMemory(uint32(os.Getpid()), 18*mib) // 10 MiB resident + 8 MiB context
	st := holdAndRelease(t, s, sock, 40*mib, 10*mib)
	if st.ReservedBytes != 10*mib {
		t.Fatalf("reserved = %d MiB, want the 10 reported", st.ReservedBytes/mib)
	}
	if v := prom.CounterValue(t, m.underReports.WithLabelValues("GPU-test")); v != 0 {
		t.Fatalf("an honest report counted as an under-report (%v)", v)
	}
}

// Where NVML cannot tell (no entry for the pid, or NVML_VALUE_NOT_AVAILABLE), the report stands.
func TestResidencyStandsWhereNVMLCannotTell(t *testing.T) {
	s, sock, _, mock := memcheckEnv(t)
	mock.SetProcessMemory(uint32(os.Getpid()), ^uint64(0))
	if st := holdAndRelease(t, s, sock, 40*mib, 0); st.ReservedBytes != 0 {
		t.Fatalf("reserved = %d MiB with NVML's value not available, want the 0 reported", st.ReservedBytes/mib)
	}
}

// An eviction's progress reports are checked against a fresh NVML read: each one raises the next
// holder by what was released, and the read cached at the release (before any of it) would hold the
// leaver at its old residency, so the hand-off would run in series. Both clients are this process;
// only the leaver reports while NVML's figure falls.
func TestEvictionProgressIsCheckedAgainstAFreshNVMLRead(t *testing.T) {
	_, sock, _, mock := memcheckEnv(t)
	pid := uint32(os.Getpid())
	mock.SetProcessMemory(pid, 48*mib) // 40 MiB of allocations + 8 MiB context
	a := dialRaw(t, sock, ClassOpportunistic)
	a.send(Message{Type: MsgAcquire, Need: 40 * mib})
	g := a.expect(MsgGrant, 2*time.Second)
	a.send(Message{Type: MsgUsage, Acks: 1, Need: 40 * mib, Resident: 40 * mib})
	a.send(Message{Type: MsgRelease, Epoch: g.Epoch, Resident: 40 * mib}) // a fresh read: 48 MiB, now cached
	b := dialRaw(t, sock, ClassOpportunistic)
	b.send(Message{Type: MsgAcquire, Need: 40 * mib})
	if e := a.expect(MsgEvict, 2*time.Second); e.Target != 24*mib {
		t.Fatalf("evict target %d MiB, want 24", e.Target/mib)
	}
	if gb := b.expect(MsgGrant, 2*time.Second); gb.Resident != 24*mib {
		t.Fatalf("b granted %d MiB, want the 24 free", gb.Resident/mib)
	}
	mock.SetProcessMemory(pid, 38*mib) // a released 10 MiB
	a.send(Message{Type: MsgUsage, Reason: UsageProgress, Acks: 1, Need: 40 * mib, Resident: 30 * mib})
	if r := b.expect(MsgRaise, 2*time.Second); r.Resident != 34*mib {
		t.Fatalf("b raised to %d MiB, want 34", r.Resident/mib)
	}
}
