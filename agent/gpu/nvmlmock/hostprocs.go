package nvmlmock

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Simulated workloads. On a machine without a GPU a process in a pod says, through its environment, what
// it would use of the simulated GPUs its container was given; the mock GPUs then list it as NVML lists a
// real GPU's processes (the compute list, or the MPS client list when it talks to an MPS daemon) with
// utilization samples. The per-pod accounting, its metrics and the GPUNode status then work end to end
// with real pods on a real kubelet, where nothing else could make a simulated GPU busy.
const (
	// EnvSimulatedMemoryMiB is the device memory, in MiB, the process uses on each GPU it sees.
	EnvSimulatedMemoryMiB = "GPUSHARING_SIMULATED_MEMORY_MIB"
	// EnvSimulatedSMPercent is the percent of each sampling period it keeps the SMs busy (default 0).
	EnvSimulatedSMPercent = "GPUSHARING_SIMULATED_SM_PERCENT"
)

// maxEnviron bounds what is read of one process's environment: a pod's process is untrusted, and the
// declaration is near the front of a container's environment anyway.
const maxEnviron = 256 << 10

// ScanHostProcesses is one pass over procRoot (the host's /proc): every process declaring simulated use
// is placed on the GPUs, or MIG devices, that NVIDIA_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) names.
// A GPU whose simulated processes changed gets them as its whole process list; a GPU that never had any
// is left alone, so other ways of setting processes keep working. Unreadable processes (exited, or not
// ours to read) are skipped.
func (s *Server) ScanHostProcesses(procRoot string) error {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return err
	}
	byGPU := map[*GPU][]Process{}
	for _, e := range entries {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		env, ok := readEnviron(filepath.Join(procRoot, e.Name(), "environ"))
		if !ok {
			continue
		}
		mib, err := strconv.ParseUint(env[EnvSimulatedMemoryMiB], 10, 32)
		if err != nil {
			continue
		}
		sm, _ := strconv.ParseUint(env[EnvSimulatedSMPercent], 10, 8)
		visible := env["NVIDIA_VISIBLE_DEVICES"]
		if visible == "" {
			visible = env["CUDA_VISIBLE_DEVICES"]
		}
		_, mps := env["CUDA_MPS_PIPE_DIRECTORY"]
		for _, id := range strings.Split(visible, ",") {
			g, gi, ci := s.deviceByUUID(strings.TrimSpace(id))
			if g == nil {
				continue
			}
			byGPU[g] = append(byGPU[g], Process{PID: uint32(pid), Memory: mib << 20, MPS: mps, GI: gi, CI: ci, SM: uint32(min(sm, 100))})
		}
	}
	for _, g := range s.GPUs {
		procs := byGPU[g]
		g.mu.Lock()
		same := g.simulated == nil && len(procs) == 0 || g.simulated != nil && slices.Equal(g.simulated, procs)
		g.mu.Unlock()
		if same {
			continue
		}
		g.SetUsage(procs...)
		g.mu.Lock()
		g.simulated = append([]Process{}, procs...)
		g.mu.Unlock()
	}
	return nil
}

// WatchHostProcesses scans every interval until ctx ends, moving each GPU's sample clock by the time that
// passed so the simulated processes' utilization reads as fresh samples.
func (s *Server) WatchHostProcesses(ctx context.Context, procRoot string, interval time.Duration, errf func(error)) {
	last := time.Now()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.ScanHostProcesses(procRoot); err != nil && errf != nil {
			errf(err)
		}
		now := time.Now()
		for _, g := range s.GPUs {
			g.AdvanceSamples(uint64(now.Sub(last).Microseconds()))
		}
		last = now
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// deviceByUUID finds a whole GPU (gi, ci -1) or a MIG device by the uuid the mock gives it.
func (s *Server) deviceByUUID(id string) (g *GPU, gi, ci int) {
	for _, g := range s.GPUs {
		if id == g.Device.UUID {
			return g, -1, -1
		}
		prefix := "MIG-" + strings.TrimPrefix(g.Device.UUID, "GPU-") + "-"
		if rest, ok := strings.CutPrefix(id, prefix); ok {
			if _, err := fmt.Sscanf(rest, "gi%d-ci%d", &gi, &ci); err == nil {
				return g, gi, ci
			}
		}
	}
	return nil, 0, 0
}

// readEnviron parses a /proc/<pid>/environ; ok is false when it cannot be read.
func readEnviron(path string) (map[string]string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer func() { _ = f.Close() }() // read-only
	buf, err := io.ReadAll(io.LimitReader(f, maxEnviron))
	if err != nil || len(buf) == 0 {
		return nil, false
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(buf, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env, true
}
