package mig

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func profilesOn(t *testing.T, g gpu.Interface, uuid string) []string {
	t.Helper()
	d, err := g.Device(context.Background(), uuid)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range d.Instances {
		if in.CIID == gpu.NoComputeInstance || in.UUID == "" {
			t.Errorf("instance %+v has no compute instance or uuid", in)
		}
		out = append(out, fmt.Sprintf("%s@%d", in.Profile, in.Placement.Start))
	}
	return out
}

func TestApplyCreatesMixedLayoutsAndASecondPassChangesNothing(t *testing.T) {
	tests := []struct {
		name   string
		server *nvmlmock.Server
		want   string
		result []string
	}{
		{"dgx a100", nvmlmock.NewA100(1), "3g.20gb x1 + 1g.5gb x4", []string{"1g.5gb@0", "1g.5gb@1", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"}},
		{"dgx a100 halves", nvmlmock.NewA100(1), "4g.20gb x1 + 3g.20gb x1", []string{"4g.20gb@0", "3g.20gb@4"}},
		{"dgx h100", nvmlmock.NewH100(1), "3g.40gb x1 + 1g.10gb x4", []string{"1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			g := gpu.NewNVML(tt.server)
			a := &Applier{GPU: g}
			mock := tt.server.GPUs[0]
			if ok, err := a.Satisfied(ctx, mock.UUID, wants(tt.want)); ok || err != nil {
				t.Fatalf("Satisfied before apply = %v, %v; want false, nil", ok, err)
			}
			if _, err := a.Apply(ctx, mock.UUID, wants(tt.want)); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if got := profilesOn(t, g, mock.UUID); !reflect.DeepEqual(got, tt.result) {
				t.Errorf("instances = %v, want %v", got, tt.result)
			}
			if calls := mock.Calls(); calls[0] != "SetMigMode(1)" {
				t.Errorf("first call = %q, want MIG mode enabled first", calls[0])
			}
			if ok, err := a.Satisfied(ctx, mock.UUID, wants(tt.want)); !ok || err != nil {
				t.Errorf("Satisfied after apply = %v, %v; want true, nil", ok, err)
			}
			if _, err := a.Apply(ctx, mock.UUID, wants(tt.want)); err != nil {
				t.Fatalf("second Apply: %v", err)
			}
			if calls := mock.Calls(); len(calls) != 0 {
				t.Errorf("second pass made NVML changes: %v", calls)
			}
		})
	}
}

func TestApplyKeepsPreExistingInstances(t *testing.T) {
	ctx := context.Background()
	s := nvmlmock.NewA100(1)
	mock := s.GPUs[0]
	mock.SetMIGMode(true, true)
	g := gpu.NewNVML(s)
	a := &Applier{GPU: g}
	if _, err := a.Apply(ctx, mock.UUID, wants("3g.20gb x1")); err != nil {
		t.Fatal(err)
	}
	before, _ := g.Device(ctx, mock.UUID)
	mock.Calls()

	if _, err := a.Apply(ctx, mock.UUID, wants("3g.20gb x1 + 1g.5gb x3")); err != nil {
		t.Fatal(err)
	}
	for _, c := range mock.Calls() {
		if strings.HasPrefix(c, "Destroy") {
			t.Errorf("extending a layout destroyed an instance: %s", c)
		}
	}
	after, _ := g.Device(ctx, mock.UUID)
	kept := false
	for _, in := range after.Instances {
		kept = kept || (in.GIID == before.Instances[0].GIID && in.UUID == before.Instances[0].UUID)
	}
	if !kept || len(after.Instances) != 4 {
		t.Errorf("instances = %+v; want the 3g.20gb %+v kept and three 1g.5gb added", after.Instances, before.Instances[0])
	}
}

// crashingGPU stops the agent, as a kill would, after a number of GPU instance creates.
type crashingGPU struct {
	gpu.Interface
	creates, crashAfter int
}

var errCrash = errors.New("agent killed")

func (c *crashingGPU) CreateGPUInstance(ctx context.Context, uuid string, profile gpu.Profile, at gpu.Placement) (gpu.Instance, error) {
	if c.creates == c.crashAfter {
		return gpu.Instance{}, errCrash
	}
	c.creates++
	return c.Interface.CreateGPUInstance(ctx, uuid, profile, at)
}

func TestApplyConvergesAfterACrashBetweenCreates(t *testing.T) {
	tests := []struct {
		name  string
		crash func(*nvmlmock.GPU, gpu.Interface) gpu.Interface
	}{
		{"killed between two GPU instance creates", func(_ *nvmlmock.GPU, g gpu.Interface) gpu.Interface {
			return &crashingGPU{Interface: g, crashAfter: 2}
		}},
		{"killed between a GPU instance and its compute instance", func(m *nvmlmock.GPU, g gpu.Interface) gpu.Interface {
			m.FailComputeInstanceCreate(2)
			return g
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := nvmlmock.NewH100(1)
			mock := s.GPUs[0]
			want := wants("3g.40gb x1 + 1g.10gb x3")
			first := &Applier{GPU: tt.crash(mock, gpu.NewNVML(s))}
			if _, err := first.Apply(ctx, mock.UUID, want); err == nil {
				t.Fatal("the interrupted apply succeeded")
			}
			mock.FailComputeInstanceCreate(0)
			// A restarted agent starts from nothing but what NVML reports.
			restarted := &Applier{GPU: gpu.NewNVML(s)}
			if _, err := restarted.Apply(ctx, mock.UUID, want); err != nil {
				t.Fatalf("Apply after restart: %v", err)
			}
			for _, c := range mock.Calls() {
				if strings.HasPrefix(c, "Destroy") {
					t.Errorf("restart destroyed what the first run created: %s", c)
				}
			}
			if ok, err := restarted.Satisfied(ctx, mock.UUID, want); !ok || err != nil {
				t.Errorf("Satisfied after restart = %v, %v", ok, err)
			}
		})
	}
}

func TestApplyReportsWhyItCannot(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*nvmlmock.GPU)
		want    string
		reason  string
		message string
		pids    []int32
	}{
		{"MIG asked of a GPU without MIG", func(m *nvmlmock.GPU) { m.SetMIGCapable(false) }, "1g.5gb x1",
			v1alpha1.ReasonNotMIGCapable, "does not support MIG", nil},
		{"layout that does not fit", func(*nvmlmock.GPU) {}, "3g.20gb x1 + 1g.10gb x4",
			v1alpha1.ReasonLayoutDoesNotFit, "1g.10gb x4 needs placements at {0,2,4,6}", nil},
		{"processes block enabling MIG mode", func(m *nvmlmock.GPU) { m.SetProcesses(4242, 4243) }, "7g.40gb x1",
			v1alpha1.ReasonGPUBusy, "enabling MIG mode would disturb 2 running processes (pids [4242 4243])", []int32{4242, 4243}},
		{"MIG mode waits for a reset", func(m *nvmlmock.GPU) { m.SetNeedsReset(true) }, "7g.40gb x1",
			v1alpha1.ReasonMIGModeChangePending, "takes effect after a GPU reset", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := nvmlmock.NewA100(1)
			mock := s.GPUs[0]
			tt.setup(mock)
			_, err := (&Applier{GPU: gpu.NewNVML(s)}).Apply(context.Background(), mock.UUID, wants(tt.want))
			o, ok := outcome.As(err)
			if !ok || o.Reason != tt.reason || !strings.Contains(o.Message, tt.message) || !reflect.DeepEqual(o.PIDs, tt.pids) {
				t.Errorf("err = %v (pids %v), want reason %s with %q and pids %v", err, o.PIDsOrNil(), tt.reason, tt.message, tt.pids)
			}
			if tt.reason == v1alpha1.ReasonLayoutDoesNotFit {
				if calls := mock.Calls(); len(calls) != 0 {
					t.Errorf("a layout that cannot fit still changed the GPU: %v", calls)
				}
			}
		})
	}
}

func TestApplyRefusesToDestroyInstancesUnderRunningProcesses(t *testing.T) {
	ctx := context.Background()
	s := nvmlmock.NewA100(1)
	mock := s.GPUs[0]
	a := &Applier{GPU: gpu.NewNVML(s)}
	if _, err := a.Apply(ctx, mock.UUID, wants("7g.40gb x1")); err != nil {
		t.Fatal(err)
	}
	mock.SetProcesses(99)
	mock.Calls()
	_, err := a.Apply(ctx, mock.UUID, wants("1g.5gb x7"))
	if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonGPUBusy || !reflect.DeepEqual(o.PIDs, []int32{99}) {
		t.Fatalf("err = %v, want GPUBusy with pid 99", err)
	}
	if calls := mock.Calls(); len(calls) != 0 {
		t.Errorf("a busy GPU was changed: %v", calls)
	}
}

func TestTeardownDestroysInstancesAndDisablesMIG(t *testing.T) {
	ctx := context.Background()
	s := nvmlmock.NewA100(1)
	mock := s.GPUs[0]
	g := gpu.NewNVML(s)
	a := &Applier{GPU: g}
	if _, err := a.Apply(ctx, mock.UUID, wants("3g.20gb x2")); err != nil {
		t.Fatal(err)
	}
	if err := a.Teardown(ctx, mock.UUID); err != nil {
		t.Fatal(err)
	}
	d, _ := g.Device(ctx, mock.UUID)
	if d.MIGMode.Current || d.MIGMode.Pending || len(d.Instances) != 0 {
		t.Errorf("after teardown: mode %+v, instances %v", d.MIGMode, d.Instances)
	}
	mock.Calls()
	if err := a.Teardown(ctx, mock.UUID); err != nil || len(mock.Calls()) != 0 {
		t.Errorf("second teardown: err %v, calls made", err)
	}
}

func TestSatisfiedKeepsCouldNotCheckApartFromDiffers(t *testing.T) {
	s := nvmlmock.NewA100(1)
	a := &Applier{GPU: gpu.NewNVML(s)}
	ok, err := a.Satisfied(context.Background(), "GPU-not-on-this-node", wants("7g.40gb x1"))
	if ok || !errors.Is(err, gpu.ErrNotFound) {
		t.Errorf("Satisfied for a GPU NVML cannot find = %v, %v; want false and ErrNotFound", ok, err)
	}
	ok, err = a.Satisfied(context.Background(), s.GPUs[0].UUID, wants("7g.40gb x1"))
	if ok || err != nil {
		t.Errorf("Satisfied for a GPU without the layout = %v, %v; want false, nil", ok, err)
	}
}
