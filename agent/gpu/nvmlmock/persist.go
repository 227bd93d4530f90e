package nvmlmock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Persisting the simulated hardware: real GPUs keep their MIG mode, instances and compute mode when the
// agent process dies, so a test that kills the agent needs simulated GPUs that do too. Persist loads the
// state a previous process left in a file and rewrites the file after every mutation that took effect
// (temp file + rename: a kill never leaves half a file). Each mutation is also appended to a journal,
// one line per call, so a test can count what every agent process did in all: creating an instance that
// already existed, or destroying one that was right, is duplicate work the journal shows.

// PersistedState is the file's content: every GPU as the last mutation left it.
type PersistedState struct {
	GPUs []PersistedGPU `json:"gpus"`
}

// PersistedGPU is one GPU's mutable state.
type PersistedGPU struct {
	UUID        string `json:"uuid"`
	MIGCurrent  int    `json:"migCurrent"`
	MIGPending  int    `json:"migPending"`
	ComputeMode int    `json:"computeMode"`
	// NextGI is the GPU instance id the next create gets (ids are never reused, as on the mock).
	NextGI    uint32         `json:"nextGI"`
	Instances []PersistedGPI `json:"instances,omitempty"`
}

// PersistedGPI is one GPU instance and its compute instances.
type PersistedGPI struct {
	ID        uint32   `json:"id"`
	ProfileID uint32   `json:"profileId"`
	Start     uint32   `json:"start"`
	Size      uint32   `json:"size"`
	NextCI    uint32   `json:"nextCI"`
	CIs       []uint32 `json:"cis,omitempty"`
	// CIProfiles are the compute instances' profile ids, in the order of CIs.
	CIProfiles []uint32 `json:"ciProfiles,omitempty"`
}

// JournalPath is where Persist appends the mutations of the state file at path.
func JournalPath(path string) string { return path + ".journal" }

// PausedPath is the file Persist creates when it pauses (PersistOptions.PauseAfter).
func PausedPath(path string) string { return path + ".paused" }

// PersistOptions are the test hooks of Persist.
type PersistOptions struct {
	// PauseAfter > 0 stops the process's n-th mutation (counted in this process) after it took effect
	// and was written: Persist creates PausedPath and blocks the calling goroutine for good, so a test
	// can SIGKILL the agent at exactly that point.
	PauseAfter int
}

// Persist makes the server's GPUs survive the process: it loads path when it exists (GPUs matched by
// UUID; a GPU the file does not name keeps its fresh state) and writes it after every mutation.
func (s *Server) Persist(path string, o PersistOptions) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		var st PersistedState
		if err := json.Unmarshal(data, &st); err != nil {
			return fmt.Errorf("simulated GPU state %s: %w", path, err)
		}
		if err := s.restore(st); err != nil {
			return fmt.Errorf("simulated GPU state %s: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	p := &persister{s: s, path: path, pauseAfter: o.PauseAfter}
	if err := p.save(); err != nil {
		return err
	}
	for _, g := range s.GPUs {
		g.mu.Lock()
		g.mutated = p.mutated
		g.mu.Unlock()
	}
	return nil
}

type persister struct {
	s          *Server
	path       string
	pauseAfter int

	mu        sync.Mutex
	mutations int
}

func (p *persister) mutated(g *GPU, call string) {
	p.mu.Lock()
	p.mutations++
	n := p.mutations
	err := p.save()
	if err == nil {
		err = appendLine(JournalPath(p.path), fmt.Sprintf("%s %s", g.Device.UUID, call))
	}
	p.mu.Unlock()
	if err != nil {
		// The simulation cannot keep its promise; a test relying on it must not pass quietly.
		panic(fmt.Sprintf("persisting simulated GPU state to %s: %v", p.path, err))
	}
	if p.pauseAfter > 0 && n == p.pauseAfter {
		if err := os.WriteFile(PausedPath(p.path), []byte(call+"\n"), 0o644); err != nil {
			panic(err)
		}
		select {} // until the test kills the process
	}
}

func (p *persister) save() error {
	data, err := json.MarshalIndent(p.s.snapshot(), "", "  ")
	if err != nil {
		return err
	}
	tmp := p.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p.path)
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// snapshot reads every GPU's mutable state.
func (s *Server) snapshot() PersistedState {
	var st PersistedState
	for _, g := range s.GPUs {
		g.mu.Lock()
		pg := PersistedGPU{UUID: g.Device.UUID, MIGCurrent: g.current, MIGPending: g.pending, ComputeMode: int(g.computeMode)}
		g.mu.Unlock()
		d := g.Device
		d.RLock()
		pg.NextGI = d.GpuInstanceCounter
		for gi := range d.GpuInstances {
			gi.RLock()
			pgi := PersistedGPI{ID: gi.Info.Id, ProfileID: gi.Info.ProfileId, Start: gi.Info.Placement.Start,
				Size: gi.Info.Placement.Size, NextCI: gi.ComputeInstanceCounter}
			var cis []*server.ComputeInstance
			for ci := range gi.ComputeInstances {
				cis = append(cis, ci)
			}
			gi.RUnlock()
			sort.Slice(cis, func(i, j int) bool { return cis[i].Info.Id < cis[j].Info.Id })
			for _, ci := range cis {
				pgi.CIs = append(pgi.CIs, ci.Info.Id)
				pgi.CIProfiles = append(pgi.CIProfiles, ci.Info.ProfileId)
			}
			pg.Instances = append(pg.Instances, pgi)
		}
		d.RUnlock()
		sort.Slice(pg.Instances, func(i, j int) bool { return pg.Instances[i].ID < pg.Instances[j].ID })
		st.GPUs = append(st.GPUs, pg)
	}
	return st
}

// restore puts the GPUs back as st describes them, with the same ids, so the agent finds what the
// process before it made.
func (s *Server) restore(st PersistedState) error {
	byUUID := map[string]*GPU{}
	for _, g := range s.GPUs {
		byUUID[g.Device.UUID] = g
	}
	for _, pg := range st.GPUs {
		g := byUUID[pg.UUID]
		if g == nil {
			return fmt.Errorf("no simulated GPU %s (the file was written for another --simulate-gpus)", pg.UUID)
		}
		g.mu.Lock()
		g.current, g.pending, g.computeMode = pg.MIGCurrent, pg.MIGPending, nvml.ComputeMode(pg.ComputeMode)
		g.mu.Unlock()
		d := g.Device
		d.Lock()
		d.GpuInstances = map[*server.GpuInstance]struct{}{}
		d.GpuInstanceCounter = pg.NextGI
		for _, pgi := range pg.Instances {
			if len(pgi.CIs) != len(pgi.CIProfiles) {
				d.Unlock()
				return fmt.Errorf("GPU %s GI %d: %d compute instances but %d profiles", pg.UUID, pgi.ID, len(pgi.CIs), len(pgi.CIProfiles))
			}
			gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{
				Device: d, Id: pgi.ID, ProfileId: pgi.ProfileID,
				Placement: nvml.GpuInstancePlacement{Start: pgi.Start, Size: pgi.Size},
			}, d.Config.MIGProfiles)
			g.overrideGI(gi)
			gi.ComputeInstanceCounter = pgi.NextCI
			for i, id := range pgi.CIs {
				ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{Device: d, GpuInstance: gi, Id: id, ProfileId: pgi.CIProfiles[i]})
				g.overrideCI(gi, ci)
				gi.ComputeInstances[ci] = struct{}{}
			}
			d.GpuInstances[gi] = struct{}{}
		}
		d.Unlock()
	}
	return nil
}
