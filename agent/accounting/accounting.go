// Package accounting tells who uses each GPU of the node and how much: the device memory and the share
// of the SMs of every compute process (MPS clients and processes on MIG instances included), as NVML
// reports them, named by pod and container through the process's cgroup, with the lock wait, hold time
// and swapped memory of the shim's clients. One Accountant samples on an interval and keeps the latest
// Snapshot for its readers: the metrics (metrics.go) and the GPUNode status (agent/node), whose sized
// claims show the memory their pods use beside what they were allocated.
package accounting

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// DefaultInterval is how often the GPUs are sampled. NVML keeps per-process utilization for a few
// seconds of samples and Prometheus scrapes every 15-30 s; 10 s keeps each scrape within one sample
// of the GPU and costs well under 1% of a core on an eight-GPU node (docs/accounting.md).
const DefaultInterval = 10 * time.Second

// PodNamer names the pod and container of host pids; *podpid.Resolver is one.
type PodNamer interface {
	Refs(ctx context.Context, pids []int32) map[int32]podpid.Ref
}

// ShimClient is what the shim's scheduler knows of one client process.
type ShimClient struct {
	PID int32
	// LockWait and LockHold are the client's total time waiting for and holding the GPU lock, a wait or
	// hold in progress included.
	LockWait, LockHold time.Duration
	// SwappedBytes is its memory in host staging, as it last reported; ResidentBytes on the GPU.
	SwappedBytes, ResidentBytes uint64
}

// ShimSource lists the shim's clients of a GPU; nil or an empty list where no scheduler runs.
type ShimSource interface {
	ShimClients(gpuUUID string) []ShimClient
}

// ShimUsage is a process's (or a container's, summed) account with the shim's scheduler.
type ShimUsage struct {
	LockWait, LockHold time.Duration
	SwappedBytes       uint64
	ResidentBytes      uint64
}

// Process is one process using a GPU.
type Process struct {
	PID int32
	// Pod is the pod and container it runs in; zero for a process outside any pod the node lists.
	Pod podpid.Ref
	// MemoryBytes is its device memory; valid only when MemoryKnown (NVML may list a process without
	// its memory, and a shim client may use only the lock).
	MemoryBytes uint64
	MemoryKnown bool
	// SMPercent is its mean SM utilization over NVML's samples since the previous read; valid only when
	// SMKnown (the GPU takes per-process samples). A process with no sample in the window was idle: 0.
	SMPercent float64
	SMKnown   bool
	// SampledAt is the end of the newest utilization sample that counted; zero without one.
	SampledAt time.Time
	// Instance is the MIG device uuid the process runs on; empty on a whole GPU.
	Instance string
	// MPS says NVML lists it as a client of the GPU's MPS server.
	MPS bool
	// Shim is its account with the shim's scheduler; nil for a process that is no shim client.
	Shim *ShimUsage
}

// Container is what one container's processes use of a GPU, summed.
type Container struct {
	podpid.Ref
	PIDs        []int32
	MemoryBytes uint64
	// MemoryComplete is false when NVML could not read the memory of one of its processes.
	MemoryComplete bool
	// SMPercent sums its processes' utilization (at most 100); valid only when SMKnown.
	SMPercent float64
	SMKnown   bool
	SampledAt time.Time
	// Shim sums its shim clients' accounts; nil where none is a client.
	Shim *ShimUsage
}

// GPU is one GPU's account at one read.
type GPU struct {
	UUID  string
	Index int
	// At is when the read was made.
	At time.Time
	// MemoryTotal and MemoryUsed are the device's, as NVML reports them (used includes the driver's
	// own reservations).
	MemoryTotal, MemoryUsed uint64
	// Processes are every process using the GPU, pods or not, ordered by pid.
	Processes []Process
	// Containers are the processes that run in pods, grouped by container, ordered by namespace, pod,
	// container.
	Containers []Container
	// ProcessesRead is false where the driver cannot list processes; UtilizationRead where it takes no
	// per-process samples (MIG GPUs, older drivers).
	ProcessesRead, UtilizationRead bool
	// Err is why the GPU could not be read (the rest is then what was read before the error).
	Err error
}

// Snapshot is the node's accounts at one read.
type Snapshot struct {
	At   time.Time
	GPUs []GPU
	// Err is why the node's GPUs could not be read at all (no NVML).
	Err error
}

// GPU returns the account of the GPU with the uuid.
func (s Snapshot) GPU(uuid string) (GPU, bool) {
	for _, g := range s.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return GPU{}, false
}

// Accountant samples the GPUs and keeps the latest Snapshot. Its zero value needs GPUs set.
type Accountant struct {
	// GPUs reads NVML.
	GPUs gpu.UsageReader
	// Pods names pids; nil leaves every process without a pod.
	Pods PodNamer
	// Shim lists the shim's clients per GPU; nil: no shim accounts.
	Shim ShimSource
	// Interval is how often Run samples (DefaultInterval).
	Interval time.Duration
	// Hurry, when set and true, has Run sample every HurryInterval instead: while a sized GPU has claims,
	// a process over its claim must be seen within seconds. A read costs milliseconds of CPU
	// (docs/accounting.md), so this stays far below a percent of a core.
	Hurry         func() bool
	HurryInterval time.Duration
	// Clock stamps the reads and drives Run; nil means the real clock.
	Clock clock.WithTicker
	// OnSample, when set, is told every snapshot Run takes; it must not block.
	OnSample func(Snapshot)

	mu     sync.Mutex
	latest Snapshot
	// since is, per GPU, NVML's timestamp of the newest utilization sample read, so each read takes only
	// newer ones.
	since map[string]uint64
	// lastSample keeps each pid's newest sample time, so an idle process keeps when it last ran.
	lastSample map[int32]time.Time
}

func (a *Accountant) clock() clock.WithTicker {
	if a.Clock == nil {
		return clock.RealClock{}
	}
	return a.Clock
}

// Latest is the last snapshot taken (zero before the first).
func (a *Accountant) Latest() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.latest
}

// Run samples every Interval (HurryInterval while Hurry says so) until ctx ends.
func (a *Accountant) Run(ctx context.Context) error {
	interval := a.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	log := logr.FromContextOrDiscard(ctx).WithName("accounting")
	var lastErr string
	for {
		snap := a.Sample(ctx)
		if msg := errText(snap.Err); msg != lastErr {
			// Logged once per change: a node without NVML would otherwise log every interval.
			if msg != "" && !errors.Is(snap.Err, gpu.ErrUnavailable) {
				log.Info("Cannot read GPU usage", "error", msg)
			}
			lastErr = msg
		}
		if a.OnSample != nil {
			a.OnSample(snap)
		}
		wait := interval
		if a.Hurry != nil && a.HurryInterval > 0 && a.HurryInterval < wait && a.Hurry() {
			wait = a.HurryInterval
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.clock().After(wait):
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Sample reads every GPU once, stores the snapshot as the latest and returns it.
func (a *Accountant) Sample(ctx context.Context) Snapshot {
	a.mu.Lock()
	since := make(map[string]uint64, len(a.since))
	for k, v := range a.since {
		since[k] = v
	}
	a.mu.Unlock()

	now := a.clock().Now()
	snap := Snapshot{At: now}
	devs, err := a.GPUs.Usage(ctx, since)
	if err != nil {
		snap.Err = err
		a.store(snap)
		return snap
	}
	var pids []int32
	for _, d := range devs {
		for _, p := range d.Processes {
			pids = append(pids, p.PID)
		}
	}
	shims := map[string][]ShimClient{}
	if a.Shim != nil {
		for _, d := range devs {
			if cs := a.Shim.ShimClients(d.UUID); len(cs) > 0 {
				shims[d.UUID] = cs
				for _, c := range cs {
					pids = append(pids, c.PID)
				}
			}
		}
	}
	var refs map[int32]podpid.Ref
	if a.Pods != nil && len(pids) > 0 {
		refs = a.Pods.Refs(ctx, pids)
	}
	a.mu.Lock()
	lastSample := a.lastSample
	a.mu.Unlock()
	newest := map[string]uint64{}
	seen := map[int32]time.Time{}
	for _, d := range devs {
		g, top := account(now, d, shims[d.UUID], refs, lastSample)
		if top > since[d.UUID] {
			newest[d.UUID] = top
		}
		for _, p := range g.Processes {
			if !p.SampledAt.IsZero() {
				seen[p.PID] = p.SampledAt
			}
		}
		snap.GPUs = append(snap.GPUs, g)
	}
	a.mu.Lock()
	if a.since == nil {
		a.since = map[string]uint64{}
	}
	for uuid, ts := range newest {
		a.since[uuid] = ts
	}
	a.lastSample = seen // pids that left are forgotten
	a.mu.Unlock()
	a.store(snap)
	return snap
}

func (a *Accountant) store(snap Snapshot) {
	a.mu.Lock()
	a.latest = snap
	a.mu.Unlock()
}

// account builds one GPU's account from NVML's read, the shim's clients and the pod names. It returns
// the newest sample timestamp read (NVML's microseconds), where the next read continues.
func account(now time.Time, d gpu.DeviceUsage, shim []ShimClient, refs map[int32]podpid.Ref, lastSample map[int32]time.Time) (GPU, uint64) {
	g := GPU{UUID: d.UUID, Index: d.Index, At: now, MemoryTotal: d.MemoryTotal, MemoryUsed: d.MemoryUsed,
		ProcessesRead: d.ProcessesRead, UtilizationRead: d.SamplesRead, Err: d.Err}
	type util struct {
		sum, n uint64
		last   uint64
	}
	utils := map[int32]*util{}
	var top uint64
	for _, s := range d.Samples {
		u := utils[s.PID]
		if u == nil {
			u = &util{}
			utils[s.PID] = u
		}
		u.sum += uint64(min(s.SM, 100))
		u.n++
		u.last = max(u.last, s.Timestamp)
		top = max(top, s.Timestamp)
	}
	for _, p := range d.Processes {
		g.Processes = append(g.Processes, Process{PID: p.PID, MemoryBytes: p.UsedMemory, MemoryKnown: p.MemoryKnown, Instance: p.Instance, MPS: p.MPS})
	}
	byPID := indexByPID(g.Processes)
	var lockOnly []Process
	for _, c := range shim {
		su := &ShimUsage{LockWait: c.LockWait, LockHold: c.LockHold, SwappedBytes: c.SwappedBytes, ResidentBytes: c.ResidentBytes}
		if q := byPID[c.PID]; q != nil {
			q.Shim = su
			continue
		}
		// A lock-only client, or one NVML does not list yet: it uses the GPU, its memory is unknown.
		lockOnly = append(lockOnly, Process{PID: c.PID, Shim: su})
	}
	g.Processes = append(g.Processes, lockOnly...)
	for i := range g.Processes {
		p := &g.Processes[i]
		p.Pod = refs[p.PID]
		if !d.SamplesRead {
			continue
		}
		p.SMKnown = true
		if u := utils[p.PID]; u != nil {
			p.SMPercent = float64(u.sum) / float64(u.n)
			p.SampledAt = time.UnixMicro(int64(u.last))
		} else {
			p.SampledAt = lastSample[p.PID] // idle since: its SM share is 0
		}
	}
	sort.Slice(g.Processes, func(i, j int) bool { return g.Processes[i].PID < g.Processes[j].PID })
	g.Containers = containers(g.Processes)
	return g, top
}

func indexByPID(ps []Process) map[int32]*Process {
	m := make(map[int32]*Process, len(ps))
	for i := range ps {
		m[ps[i].PID] = &ps[i]
	}
	return m
}

// containers groups the processes that run in pods by container.
func containers(ps []Process) []Container {
	byKey := map[podpid.Ref]*Container{}
	var out []*Container
	for _, p := range ps {
		if p.Pod.Name == "" {
			continue
		}
		key := podpid.Ref{Namespace: p.Pod.Namespace, Name: p.Pod.Name, Container: p.Pod.Container, UID: p.Pod.UID}
		c := byKey[key]
		if c == nil {
			c = &Container{Ref: key, MemoryComplete: true, SMKnown: true}
			byKey[key] = c
			out = append(out, c)
		}
		c.PIDs = append(c.PIDs, p.PID)
		if p.MemoryKnown {
			c.MemoryBytes += p.MemoryBytes
		} else if p.Shim == nil || p.Shim.ResidentBytes > 0 {
			// A lock-only shim client holds no memory of its own; anything else NVML could not read.
			c.MemoryComplete = false
		}
		c.SMKnown = c.SMKnown && p.SMKnown
		c.SMPercent = min(c.SMPercent+p.SMPercent, 100)
		if p.SampledAt.After(c.SampledAt) {
			c.SampledAt = p.SampledAt
		}
		if p.Shim != nil {
			if c.Shim == nil {
				c.Shim = &ShimUsage{}
			}
			c.Shim.LockWait += p.Shim.LockWait
			c.Shim.LockHold += p.Shim.LockHold
			c.Shim.SwappedBytes += p.Shim.SwappedBytes
			c.Shim.ResidentBytes += p.Shim.ResidentBytes
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.Container < b.Container
	})
	res := make([]Container, len(out))
	for i, c := range out {
		res[i] = *c
	}
	return res
}
