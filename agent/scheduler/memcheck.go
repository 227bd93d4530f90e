package scheduler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// What the scheduler trusts in a memory report. A client's Release and Usage carry the bytes it says it
// has resident; the scheduler lowers the client's reservation to that figure and hands the rest to
// others. A client that under-reports would take memory others are then granted, and their swap-ins
// would fail. Where NVML can see per-process memory, the figure it reports for the client's pid (less
// Guards.ContextOverhead, the CUDA context and driver memory that is outside the budget) is a floor:
// the scheduler accounts the larger of the two. It never lowers a report: an over-report only costs
// the client itself. A report that answers an EVICT or gives its progress, and a Release, are checked
// against a fresh read (a cached read may predate the frees they follow); periodic reports may use one
// up to procMemTTL old.

// procMemTTL bounds how often one GPU's process list is read: reports may come every few
// milliseconds, and one NVML read costs about a millisecond.
const procMemTTL = 250 * time.Millisecond

type procMemCache struct {
	mu   sync.Mutex
	byGP map[string]procMemEntry
}

type procMemEntry struct {
	at   time.Time
	used map[int32]uint64
}

// nvmlResident returns the memory NVML sees pid use on GPU uuid; ok is false when it cannot tell.
// fresh skips the cache.
func (s *Scheduler) nvmlResident(uuid string, pid int32, fresh bool) (uint64, bool) {
	if s.opts.ProcessMemory == nil || pid <= 0 {
		return 0, false
	}
	c := &s.procMem
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.opts.Clock.Now()
	e, ok := c.byGP[uuid]
	if fresh || !ok || now.Sub(e.at) >= procMemTTL || now.Before(e.at) {
		used, err := s.opts.ProcessMemory(uuid)
		if err != nil {
			used = nil // could not check: trust the report rather than invent a figure
		}
		e = procMemEntry{at: now, used: used}
		if c.byGP == nil {
			c.byGP = map[string]procMemEntry{}
		}
		c.byGP[uuid] = e
	}
	v, ok := e.used[pid]
	// NVML answers NVML_VALUE_NOT_AVAILABLE (all ones) where it may not read a process's memory.
	if !ok || v == ^uint64(0) {
		return 0, false
	}
	return v, true
}

// crossCheck raises the residency a Release or Usage reports to what NVML sees the process hold.
func (s *Scheduler) crossCheck(q *queue, pid int32, m Message) Message {
	if m.Type != MsgRelease && m.Type != MsgUsage {
		return m
	}
	// An eviction's progress reports too: each raises the next holder by what it released (fill.go),
	// and a read cached from before the eviction would hold every one of them at the old figure.
	fresh := m.Type == MsgRelease || m.Reason == UsageEvicted || m.Reason == UsageProgress
	seen, ok := s.nvmlResident(q.uuid, pid, fresh)
	if !ok || seen <= s.opts.ContextOverhead {
		return m
	}
	if floor := seen - s.opts.ContextOverhead; floor > m.Resident {
		s.metrics.underReports.WithLabelValues(q.uuid).Inc()
		q.log.V(1).Info("Shim client reported less resident memory than NVML sees; accounting NVML's figure",
			"pid", pid, "reported", m.Resident, "nvml", seen, "contextOverhead", s.opts.ContextOverhead)
		m.Resident = floor
	}
	return m
}

// ProcessMemoryFrom reads each process's device memory through the agent's GPU interface (NVML's
// running compute processes), for Guards.ProcessMemory. Where NVML is missing it errors, and reports
// are taken as they come.
func ProcessMemoryFrom(g gpu.Interface) func(uuid string) (map[int32]uint64, error) {
	return func(uuid string) (map[int32]uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := g.Device(ctx, uuid)
		if err != nil {
			return nil, fmt.Errorf("reading the processes of GPU %s: %w", uuid, err)
		}
		out := make(map[int32]uint64, len(d.Processes))
		for _, p := range d.Processes {
			out[p.PID] = p.UsedMemory
		}
		return out, nil
	}
}
