package timeslice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

const gpuUUID = "GPU-0000bbbb-0000-0000-0000-000000000000"

func TestApplyRunsNvidiaSMIOnlyWhenTheIntervalChanges(t *testing.T) {
	steps := []struct {
		name  string
		apply *Setting // nil means Reset
		calls []string
	}{
		{"default interval on a fresh GPU runs nothing", &Setting{Interval: v1alpha1.TimeSliceDefault, Replicas: 4}, nil},
		{"short", &Setting{Interval: v1alpha1.TimeSliceShort, Replicas: 4}, []string{"nvidia-smi compute-policy -i " + gpuUUID + " --set-timeslice=1"}},
		{"the same again runs nothing", &Setting{Interval: v1alpha1.TimeSliceShort, Replicas: 4}, nil},
		{"new replicas only are recorded without a command", &Setting{Interval: v1alpha1.TimeSliceShort, Replicas: 8}, nil},
		{"long", &Setting{Interval: v1alpha1.TimeSliceLong, Replicas: 8}, []string{"nvidia-smi compute-policy -i " + gpuUUID + " --set-timeslice=3"}},
		{"medium", &Setting{Interval: v1alpha1.TimeSliceMedium, Replicas: 8}, []string{"nvidia-smi compute-policy -i " + gpuUUID + " --set-timeslice=2"}},
		{"reset returns to the default", nil, []string{"nvidia-smi compute-policy -i " + gpuUUID + " --set-timeslice=0"}},
		{"a second reset runs nothing", nil, nil},
	}
	dir := t.TempDir()
	smi := fakebin.NvidiaSMI(t, dir, false)
	m := &Manager{SMI: smi.Path, StateDir: dir + "/state", Runner: runner.Exec{}}
	ctx := context.Background()
	for _, s := range steps {
		var err error
		if s.apply != nil {
			err = m.Apply(ctx, gpuUUID, *s.apply)
		} else {
			err = m.Reset(ctx, gpuUUID)
		}
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := smi.Calls(t); !reflect.DeepEqual(got, s.calls) {
			t.Errorf("%s: commands = %q, want %q", s.name, got, s.calls)
		}
		if s.apply != nil {
			if ok, err := m.Satisfied(gpuUUID, *s.apply); !ok || err != nil {
				t.Errorf("%s: Satisfied = %v, %v", s.name, ok, err)
			}
		} else if _, ok, _ := m.State(gpuUUID); ok {
			t.Errorf("%s: time-slicing still recorded after reset", s.name)
		}
	}
}

func TestAFailedCommandRecordsNothing(t *testing.T) {
	dir := t.TempDir()
	m := &Manager{SMI: fakebin.NvidiaSMI(t, dir, true).Path, StateDir: dir + "/state", Runner: runner.Exec{}}
	err := m.Apply(context.Background(), gpuUUID, Setting{Interval: v1alpha1.TimeSliceShort, Replicas: 2})
	var exit *runner.ExitError
	if !errors.As(err, &exit) || exit.Result.ExitCode != 3 || exit.Error() == "" {
		t.Fatalf("err = %v, want the command's exit error", err)
	}
	if _, ok, _ := m.State(gpuUUID); ok {
		t.Error("a failed nvidia-smi left time-slicing recorded")
	}
}

func TestAnUnreadableStateIsAnErrorNotADifference(t *testing.T) {
	dir := t.TempDir()
	smi := fakebin.NvidiaSMI(t, dir, false)
	m := &Manager{SMI: smi.Path, StateDir: dir, Runner: runner.Exec{}}
	if err := os.WriteFile(filepath.Join(dir, gpuUUID+".json"), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.Satisfied(gpuUUID, Setting{Interval: v1alpha1.TimeSliceShort, Replicas: 2}); ok || err == nil {
		t.Errorf("Satisfied on a torn state file = %v, %v; want an error", ok, err)
	}
	if err := m.Apply(context.Background(), gpuUUID, Setting{Interval: v1alpha1.TimeSliceShort, Replicas: 2}); err == nil {
		t.Error("Apply over a torn state file succeeded without knowing what is in force")
	}
	if calls := smi.Calls(t); len(calls) != 0 {
		t.Errorf("nvidia-smi ran although the state could not be read: %q", calls)
	}
}
