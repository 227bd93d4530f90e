package guard

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A process that holds a context on a shared GPU outside what manages the GPU (the shim's scheduler, the
// MPS server) is outside every lock, ledger and limit the sharing promises: a pod that dropped
// LD_PRELOAD, a static binary, a driver loaded through dlmopen, a shim whose first connect failed, a
// process that bypassed the MPS pipe. NVML lists it all the same. The check compares, per read of the
// accounting, NVML's processes on each checked GPU with the GPU's managed clients, and names a pod's
// process that stays unmanaged past the grace.

// DefaultUnmanagedGrace is how long a pod's process may hold a context on a checked GPU unmanaged before
// it is named. The shim connects at the process's first context and is served within its connect
// timeout (1 s); the grace leaves room for a WELCOME that waits on the pod lookups, and for NVML listing
// a process a read before the scheduler does.
const DefaultUnmanagedGrace = 5 * time.Second

// CheckInterval is how often the accounting reads the GPUs while one is checked for unmanaged processes
// or has sized claims, so a process is named within UnmanagedBound rather than at the 10 s default.
const CheckInterval = 2 * time.Second

// UnmanagedBound is the stated bound, with the default grace and interval: a process is first listed by
// NVML at most one read after it takes its context, named at the first read past the grace after that,
// and published by the pass that read wakes (milliseconds). docs/accounting.md states it.
const UnmanagedBound = DefaultUnmanagedGrace + 2*CheckInterval

// UnmanagedBoundAfterStart is the bound from the agent's start (a restart included) or from a GPU
// becoming checked: the read current at the pass that starts the check does not count (after), so the
// first read that can list the process is one interval later, and then as UnmanagedBound.
const UnmanagedBoundAfterStart = UnmanagedBound + CheckInterval

// Kind says what manages the processes of a checked GPU.
type Kind int

const (
	// KindNone: the GPU is not checked (nothing there tells a managed process from another).
	KindNone Kind = iota
	// KindShim: a managed process is a connected client of the GPU's shim scheduler (oversubscription).
	KindShim
	// KindMPS: a managed process is a client of the GPU's MPS server (MPS sized per claim).
	KindMPS
)

// KindOf is how the GPU with the applied sharing a is checked.
func KindOf(a *v1alpha1.AppliedSharing) Kind {
	switch {
	case a == nil:
		return KindNone
	case a.Shim != nil:
		return KindShim
	case a.Strategy == v1alpha1.StrategyMPS && a.Sizing.PerClaim():
		return KindMPS
	}
	return KindNone
}

// managed says whether the process is managed on a GPU of kind k.
func (k Kind) managed(p accounting.Process) bool {
	switch k {
	case KindShim:
		return p.Shim != nil
	case KindMPS:
		return p.MPS
	}
	return true
}

// Process is a pod's process on a checked GPU that is not managed there.
type Process struct {
	vacate.PodRef
	// UID is the pod's: an eviction's precondition, so a pod recreated under the same name is spared.
	UID       types.UID
	Container string
	PID       int32
	// MemoryBytes is its device memory as NVML reads it; valid only when MemoryKnown.
	MemoryBytes uint64
	MemoryKnown bool
	// Since is the read that first showed it unmanaged.
	Since time.Time
}

// Verdict is one checked GPU at one read.
type Verdict struct {
	Kind Kind
	// Read is false where the accounting has not read the GPU's processes (yet, or this time).
	Read bool
	// Clients counts the managed processes; Host those of no pod (never named).
	Clients, Host int
	// Named are the pods' processes unmanaged past the grace, the largest first; Waiting counts those
	// still within it.
	Named   []Process
	Waiting int
}

// procKey is one process on one GPU.
type procKey struct {
	gpu string
	pid int32
}

// unmanagedSince is when a read first showed a process unmanaged, and the pod it was in then ("" while
// no pod was named for it).
type unmanagedSince struct {
	at  time.Time
	uid string
}

// Unmanaged tracks, across reads, since when each pod's process on a checked GPU has been unmanaged.
// Its methods are safe for the accounting's goroutine and the reconciler's pass together.
type Unmanaged struct {
	// Grace is DefaultUnmanagedGrace where zero.
	Grace time.Duration

	mu sync.Mutex
	// first is the read that first showed each process unmanaged; an entry leaves when a read of its
	// GPU no longer shows it so.
	first map[procKey]unmanagedSince
	// kinds are the GPUs checked at the last pass; published, the processes it named per GPU.
	kinds     map[string]Kind
	published map[string][]procKey
	// after is, per checked GPU, the time of the snapshot current when the GPU became checked (or changed
	// kind): only reads newer than it count. The pass that checks a GPU first has just started its
	// scheduler (an agent that restarted, a GPU that turned to oversubscription), and a read from before
	// would show every process unmanaged and start their grace before they could connect.
	after map[string]time.Time
}

func (u *Unmanaged) grace() time.Duration {
	if u.Grace <= 0 {
		return DefaultUnmanagedGrace
	}
	return u.Grace
}

// Checking says whether a GPU is checked, so the accounting reads every CheckInterval.
func (u *Unmanaged) Checking() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.kinds) > 0
}

// Judge returns the verdict of every checked GPU in kinds from the snapshot, records kinds for the reads
// between passes (Changed) and Checking, and what it names as published (Changed compares with it).
func (u *Unmanaged) Judge(snap accounting.Snapshot, kinds map[string]Kind) map[string]Verdict {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.after == nil {
		u.after = map[string]time.Time{}
	}
	fresh := map[string]bool{}
	for uuid, k := range kinds {
		if old, ok := u.kinds[uuid]; !ok || old != k {
			u.after[uuid] = snap.At
			fresh[uuid] = true
		}
	}
	for uuid := range u.after {
		if _, ok := kinds[uuid]; !ok {
			delete(u.after, uuid)
		}
	}
	u.kinds = kinds
	for key := range u.first {
		if _, ok := kinds[key.gpu]; !ok || fresh[key.gpu] {
			delete(u.first, key) // a GPU no longer checked, or checked anew, starts anew
		}
	}
	out := make(map[string]Verdict, len(kinds))
	u.published = map[string][]procKey{}
	for uuid, k := range kinds {
		v := u.observe(snap, uuid, k)
		out[uuid] = v
		u.published[uuid] = keysOf(uuid, v.Named)
	}
	return out
}

// Changed says whether a snapshot names other processes than the last pass published, which is worth a
// pass of its own.
func (u *Unmanaged) Changed(snap accounting.Snapshot) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	changed := false
	for uuid, k := range u.kinds {
		v := u.observe(snap, uuid, k)
		if v.Read && !slices.Equal(keysOf(uuid, v.Named), u.published[uuid]) {
			changed = true
		}
	}
	return changed
}

func keysOf(uuid string, ps []Process) []procKey {
	keys := make([]procKey, len(ps))
	for i, p := range ps {
		keys[i] = procKey{gpu: uuid, pid: p.PID}
	}
	slices.SortFunc(keys, func(a, b procKey) int { return cmp.Compare(a.pid, b.pid) })
	return keys
}

// observe judges one GPU of the snapshot, recording when each unmanaged process was first read and
// forgetting those no longer unmanaged there. u.mu is held.
func (u *Unmanaged) observe(snap accounting.Snapshot, uuid string, k Kind) Verdict {
	v := Verdict{Kind: k}
	acct, ok := snap.GPU(uuid)
	if !ok || acct.Err != nil || !acct.ProcessesRead || snap.Err != nil || !acct.At.After(u.after[uuid]) {
		return v
	}
	v.Read = true
	if u.first == nil {
		u.first = map[procKey]unmanagedSince{}
	}
	now := map[procKey]bool{}
	for _, p := range acct.Processes {
		if k.managed(p) {
			v.Clients++
			continue
		}
		// The grace runs from the first read that shows the process unmanaged, whether or not its pod is
		// named yet: a pod the agent has not listed before is named once its pod list includes it.
		key := procKey{gpu: uuid, pid: p.PID}
		now[key] = true
		since, seen := u.first[key]
		if !seen || since.uid != "" && p.Pod.UID != "" && since.uid != p.Pod.UID {
			since = unmanagedSince{at: acct.At} // new, or the pid of another pod now
		}
		if since.uid == "" {
			since.uid = p.Pod.UID
		}
		u.first[key] = since
		switch {
		case p.Pod.Name == "":
			v.Host++ // the MPS server, nvidia-smi, DCGM, anything of the host (or a pod not named yet)
		case acct.At.Sub(since.at) < u.grace():
			v.Waiting++
		default:
			v.Named = append(v.Named, Process{PodRef: vacate.PodRef{Namespace: p.Pod.Namespace, Name: p.Pod.Name}, UID: types.UID(p.Pod.UID),
				Container: p.Pod.Container, PID: p.PID, MemoryBytes: p.MemoryBytes, MemoryKnown: p.MemoryKnown, Since: since.at})
		}
	}
	for key := range u.first {
		if key.gpu == uuid && !now[key] {
			delete(u.first, key)
		}
	}
	slices.SortFunc(v.Named, func(a, b Process) int {
		return cmp.Or(cmp.Compare(b.MemoryBytes, a.MemoryBytes), cmp.Compare(a.PodRef.String(), b.PodRef.String()), cmp.Compare(a.PID, b.PID))
	})
	return v
}
