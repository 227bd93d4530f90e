// Package timeslice sets a GPU's time-slice length through `nvidia-smi compute-policy` and records the
// time-slicing in force (interval and replicas) in a state file for the device plugin and for restarts.
// NVML offers no getter for the time slice, so the state file under a runtime directory (cleared on
// reboot, as the driver's setting is) is what Satisfied compares against.
package timeslice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"

	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Setting is the time-slicing the agent put in force on a GPU.
type Setting struct {
	Interval v1alpha1.TimeSliceInterval `json:"interval"`
	Replicas int32                      `json:"replicas"`
}

// Manager applies time-slicing to GPUs.
type Manager struct {
	// SMI is the path of nvidia-smi.
	SMI string
	// StateDir holds one file per GPU uuid; it should not outlive a reboot (e.g. under /run).
	StateDir string
	// Runner runs nvidia-smi.
	Runner runner.Runner
}

// value maps an interval to nvidia-smi's --set-timeslice argument.
func value(i v1alpha1.TimeSliceInterval) (int, error) {
	switch i {
	case v1alpha1.TimeSliceDefault, "":
		return 0, nil
	case v1alpha1.TimeSliceShort:
		return 1, nil
	case v1alpha1.TimeSliceMedium:
		return 2, nil
	case v1alpha1.TimeSliceLong:
		return 3, nil
	}
	return 0, fmt.Errorf("unknown time-slice interval %q", i)
}

func (m *Manager) path(uuid string) string { return filepath.Join(m.StateDir, uuid+".json") }

// State returns the time-slicing in force, and false when none is (the GPU runs the driver's default).
// An error means the state could not be read, not that it differs.
func (m *Manager) State(uuid string) (Setting, bool, error) {
	data, err := os.ReadFile(m.path(uuid))
	if errors.Is(err, os.ErrNotExist) {
		return Setting{}, false, nil
	}
	if err != nil {
		return Setting{}, false, err
	}
	var s Setting
	if err := json.Unmarshal(data, &s); err != nil {
		return Setting{}, false, fmt.Errorf("reading %s: %w", m.path(uuid), err)
	}
	return s, true, nil
}

// Satisfied reports whether want is in force.
func (m *Manager) Satisfied(uuid string, want Setting) (bool, error) {
	have, ok, err := m.State(uuid)
	if err != nil {
		return false, err
	}
	return ok && normalize(have) == normalize(want), nil
}

func normalize(s Setting) Setting {
	if s.Interval == "" {
		s.Interval = v1alpha1.TimeSliceDefault
	}
	return s
}

// Apply puts want in force: nvidia-smi runs only when the interval differs from what is in force.
func (m *Manager) Apply(ctx context.Context, uuid string, want Setting) error {
	want = normalize(want)
	have, ok, err := m.State(uuid)
	if err != nil {
		return err
	}
	if ok && normalize(have) == want {
		return nil
	}
	current := v1alpha1.TimeSliceDefault
	if ok {
		current = normalize(have).Interval
	}
	if current != want.Interval {
		if err := m.set(ctx, uuid, want.Interval); err != nil {
			return err
		}
	}
	return m.write(uuid, want)
}

// Reset returns the GPU to the driver's default time slice and forgets the time-slicing.
func (m *Manager) Reset(ctx context.Context, uuid string) error {
	have, ok, err := m.State(uuid)
	if err != nil || !ok {
		return err
	}
	if normalize(have).Interval != v1alpha1.TimeSliceDefault {
		if err := m.set(ctx, uuid, v1alpha1.TimeSliceDefault); err != nil {
			return err
		}
	}
	return os.Remove(m.path(uuid))
}

func (m *Manager) set(ctx context.Context, uuid string, i v1alpha1.TimeSliceInterval) error {
	v, err := value(i)
	if err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).Info("Setting GPU time slice", "gpu", uuid, "interval", string(i))
	_, err = m.Runner.Run(ctx, runner.Cmd{Path: m.SMI, Args: []string{"compute-policy", "-i", uuid, fmt.Sprintf("--set-timeslice=%d", v)}})
	return err
}

func (m *Manager) write(uuid string, s Setting) error {
	if err := os.MkdirAll(m.StateDir, 0o755); err != nil {
		return err
	}
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	// Write then rename, so an agent killed mid-write never leaves a torn state file.
	tmp := m.path(uuid) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, m.path(uuid))
}
