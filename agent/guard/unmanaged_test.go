package guard

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const gpu0 = "GPU-0"

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func pod(name string) podpid.Ref {
	return podpid.Ref{Namespace: "default", Name: name, Container: "main", UID: "uid-" + name}
}

// proc is a process NVML lists with mem bytes, of pod (zero: of the host).
func proc(pid int32, p podpid.Ref, mem uint64) accounting.Process {
	return accounting.Process{PID: pid, Pod: p, MemoryBytes: mem, MemoryKnown: true}
}

func client(p accounting.Process) accounting.Process {
	p.Shim = &accounting.ShimUsage{}
	return p
}

func mpsClient(p accounting.Process) accounting.Process {
	p.MPS = true
	return p
}

func snapAt(at time.Duration, ps ...accounting.Process) accounting.Snapshot {
	return accounting.Snapshot{At: t0.Add(at), GPUs: []accounting.GPU{{UUID: gpu0, At: t0.Add(at), ProcessesRead: true, Processes: ps}}}
}

// checking has u check the GPUs of kinds from a pass whose latest snapshot is from before t0, so the
// reads from t0 on count.
func checking(u *Unmanaged, kinds map[string]Kind) *Unmanaged {
	u.Judge(accounting.Snapshot{At: t0.Add(-time.Second)}, kinds)
	return u
}

func named(v Verdict) string {
	s := ""
	for _, p := range v.Named {
		s += fmt.Sprintf("%s:%d ", p.PodRef, p.PID)
	}
	return s
}

// A pod's process that holds a context and is no client is named at the first read past the grace from
// the read that first showed it, not before; a client and a host process never are, and are counted.
func TestAProcessUnmanagedPastTheGraceIsNamedAndClientsAndHostNeverAre(t *testing.T) {
	shim := map[string]Kind{gpu0: KindShim}
	u := checking(&Unmanaged{Grace: 5 * time.Second}, shim)
	ps := []accounting.Process{
		client(proc(10, pod("holder"), 4<<30)),
		proc(11, pod("dropper"), 2<<30),
		proc(12, podpid.Ref{}, 300<<20), // nvidia-smi, DCGM
	}
	for _, at := range []time.Duration{0, 2 * time.Second, 4 * time.Second} {
		v := u.Judge(snapAt(at, ps...), shim)[gpu0]
		if len(v.Named) != 0 || v.Waiting != 1 || v.Clients != 1 || v.Host != 1 {
			t.Fatalf("at %v, within the grace: named %q, waiting %d, clients %d, host %d", at, named(v), v.Waiting, v.Clients, v.Host)
		}
	}
	v := u.Judge(snapAt(6*time.Second, ps...), shim)[gpu0]
	if got := named(v); got != "default/dropper:11 " || v.Named[0].Since != t0 || v.Named[0].Container != "main" || v.Named[0].UID != "uid-dropper" {
		t.Fatalf("past the grace: named %q (%+v), want default/dropper:11 since the first read", got, v.Named)
	}
	// The process connects (a late WELCOME): no longer named; if it drops again its grace starts anew.
	ps[1] = client(ps[1])
	if v := u.Judge(snapAt(8*time.Second, ps...), shim)[gpu0]; len(v.Named) != 0 || v.Clients != 2 {
		t.Fatalf("once a client: named %q, clients %d", named(v), v.Clients)
	}
	ps[1].Shim = nil
	if v := u.Judge(snapAt(10*time.Second, ps...), shim)[gpu0]; len(v.Named) != 0 || v.Waiting != 1 {
		t.Fatalf("dropped again: named %q at once, want a new grace", named(v))
	}
}

// On a sized MPS GPU a managed process is a client of the MPS server; the server itself is the host's.
func TestOnASizedMPSGPUAProcessThatBypassesTheServerIsNamed(t *testing.T) {
	mps := map[string]Kind{gpu0: KindMPS}
	u := checking(&Unmanaged{Grace: time.Second}, mps)
	ps := []accounting.Process{mpsClient(proc(20, pod("a"), 1<<30)), proc(21, pod("b"), 1<<30), proc(22, podpid.Ref{}, 64<<20)}
	u.Judge(snapAt(0, ps...), mps)
	v := u.Judge(snapAt(2*time.Second, ps...), mps)[gpu0]
	if named(v) != "default/b:21 " || v.Clients != 1 || v.Host != 1 {
		t.Fatalf("named %q, clients %d, host %d; want default/b:21, 1, 1", named(v), v.Clients, v.Host)
	}
}

// Which GPUs are checked: the shim's (oversubscription) and MPS sized per claim; nothing else.
func TestKindOfChecksShimAndSizedMPSGPUsOnly(t *testing.T) {
	perClaim := &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}
	for _, c := range []struct {
		a    *v1alpha1.AppliedSharing
		want Kind
	}{
		{nil, KindNone},
		{&v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, Shim: &v1alpha1.ShimStatus{}}, KindShim},
		{&v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing}, KindNone},
		{&v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, Sizing: perClaim}, KindMPS},
		{&v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS}, KindNone},
		{&v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG}, KindNone},
	} {
		if got := KindOf(c.a); got != c.want {
			t.Errorf("KindOf(%+v) = %v, want %v", c.a, got, c.want)
		}
	}
}

// Between passes, a read that names another process than the last pass published asks for a pass; one
// that names the same does not; an unread GPU changes nothing.
func TestChangedAsksForAPassOnlyWhenTheNamedProcessesChange(t *testing.T) {
	shim := map[string]Kind{gpu0: KindShim}
	u := checking(&Unmanaged{Grace: time.Second}, shim)
	ps := []accounting.Process{proc(11, pod("dropper"), 1<<30)}
	u.Judge(snapAt(0, ps...), shim)
	if u.Changed(snapAt(500*time.Millisecond, ps...)) {
		t.Fatal("changed within the grace")
	}
	if !u.Changed(snapAt(1500*time.Millisecond, ps...)) {
		t.Fatal("not changed once the process is past its grace")
	}
	u.Judge(snapAt(1500*time.Millisecond, ps...), shim)
	if u.Changed(snapAt(2*time.Second, ps...)) {
		t.Fatal("changed while the same process stays named")
	}
	unread := snapAt(3 * time.Second)
	unread.GPUs[0].ProcessesRead = false
	if u.Changed(unread) {
		t.Fatal("changed on an unread GPU")
	}
	if !u.Changed(snapAt(3 * time.Second)) {
		t.Fatal("not changed once the process left")
	}
	if !u.Checking() {
		t.Fatal("not checking with a checked GPU")
	}
}

// The status lists at most MaxUnmanagedInStatus processes, the largest first, and counts the rest.
func TestStatusIsBoundedAndCountsWhatItLeavesOut(t *testing.T) {
	v := Verdict{Kind: KindShim, Read: true, Clients: 2, Host: 1}
	for i := range v1alpha1.MaxUnmanagedInStatus + 3 {
		v.Named = append(v.Named, Process{PID: int32(100 + i), MemoryBytes: 1 << 30, MemoryKnown: true})
	}
	st := Status(v, nil)
	if len(st.Processes) != v1alpha1.MaxUnmanagedInStatus || st.OmittedProcesses != 3 || st.Clients != 2 || st.HostProcesses != 1 {
		t.Fatalf("status %+v", st)
	}
	prev := st
	if kept := Status(Verdict{Read: false}, prev); kept.OmittedProcesses != 3 {
		t.Fatalf("an unread GPU's status %+v, want the published one", kept)
	}
}

// A process whose pod the agent names only later (a pod it had not listed yet) keeps the grace that
// began at its first read; the same pid in another pod starts a new one.
func TestTheGraceRunsFromTheFirstReadEvenBeforeThePodIsNamed(t *testing.T) {
	shim := map[string]Kind{gpu0: KindShim}
	u := checking(&Unmanaged{Grace: 5 * time.Second}, shim)
	if v := u.Judge(snapAt(0, proc(11, podpid.Ref{}, 1<<30)), shim)[gpu0]; v.Host != 1 || len(v.Named) != 0 {
		t.Fatalf("unnamed: host %d, named %q", v.Host, named(v))
	}
	v := u.Judge(snapAt(6*time.Second, proc(11, pod("late"), 1<<30)), shim)[gpu0]
	if named(v) != "default/late:11 " || v.Named[0].Since != t0 {
		t.Fatalf("named once its pod is: %q, want default/late:11 since the first read", named(v))
	}
	if v := u.Judge(snapAt(8*time.Second, proc(11, pod("other"), 1<<30)), shim)[gpu0]; len(v.Named) != 0 || v.Waiting != 1 {
		t.Fatalf("the pid in another pod: named %q, want a new grace", named(v))
	}
}

// The pass that checks a GPU first has just started its scheduler: the snapshot current then (taken
// before any client could connect) does not count, and the grace starts at the first read after it. A
// GPU that stops being checked and is checked again starts anew.
func TestAGPUNewlyCheckedCountsOnlyReadsAfterIt(t *testing.T) {
	u := &Unmanaged{Grace: 5 * time.Second}
	shim := map[string]Kind{gpu0: KindShim}
	dropper := proc(11, pod("dropper"), 1<<30)
	if v := u.Judge(snapAt(0, dropper), shim)[gpu0]; v.Read || v.Waiting != 0 {
		t.Fatalf("the snapshot current when the GPU became checked counted: %+v", v)
	}
	if v := u.Judge(snapAt(5*time.Second, dropper), shim)[gpu0]; !v.Read || len(v.Named) != 0 || v.Waiting != 1 {
		t.Fatalf("the first read after: %+v, want it waiting (its grace starts here, not at 0)", v)
	}
	if v := u.Judge(snapAt(10*time.Second, dropper), shim)[gpu0]; named(v) != "default/dropper:11 " {
		t.Fatalf("a grace after the first read: named %q", named(v))
	}
	u.Judge(snapAt(12*time.Second, dropper), map[string]Kind{})
	if v := u.Judge(snapAt(14*time.Second, dropper), shim)[gpu0]; v.Read || len(v.Named) != 0 {
		t.Fatalf("checked again: %+v, want the snapshot current then not to count", v)
	}
}

// The bounds the docs state, with reads every CheckInterval at the worst phase: a process that takes its
// context just after a read is named within UnmanagedBound; after the agent starts (the read current then
// not counting) within UnmanagedBoundAfterStart, and not within UnmanagedBound.
func TestTheStatedBoundsHoldAtTheWorstPhase(t *testing.T) {
	shim := map[string]Kind{gpu0: KindShim}
	dropper := proc(11, pod("dropper"), 1<<30)
	// namedAt reads every interval from first on (the first read is the pass that starts the check when
	// fresh) and returns the time of the read that names the process.
	namedAt := func(u *Unmanaged, first time.Duration) time.Duration {
		for at := first; at < time.Minute; at += CheckInterval {
			if v := u.Judge(snapAt(at, dropper), shim)[gpu0]; len(v.Named) == 1 {
				return at
			}
		}
		t.Fatal("never named")
		return 0
	}
	// Checked for a while; the context comes a hair after a read at 0, so the next read is at 2 s.
	u := checking(&Unmanaged{}, shim)
	if got := namedAt(u, CheckInterval) - time.Millisecond; got > UnmanagedBound {
		t.Errorf("named %v after its context, bound %v", got, UnmanagedBound)
	}
	// The agent starts a hair after the process took its context; its first pass reads at once.
	u = &Unmanaged{}
	got := namedAt(u, time.Millisecond)
	if got > UnmanagedBoundAfterStart {
		t.Errorf("named %v after the agent's start, bound %v", got, UnmanagedBoundAfterStart)
	}
	// Its first pass a whole interval later: the bound after a start is needed, UnmanagedBound too short.
	u = &Unmanaged{}
	if got := namedAt(u, CheckInterval); got <= UnmanagedBound || got > UnmanagedBoundAfterStart {
		t.Errorf("named %v after the agent's start with the first pass an interval late; want past %v, within %v",
			got, UnmanagedBound, UnmanagedBoundAfterStart)
	}
}
