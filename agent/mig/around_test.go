package mig

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// On a dynamic MIG GPU the fixed layout is placed around the instances created for claims, which are
// neither counted as the layout's nor destroyed.
func TestApplyAroundLeavesTheClaimsInstancesAlone(t *testing.T) {
	ctx := context.Background()
	g, a, d := migH100(t)
	p3g, _ := d.Profile("3g.40gb")
	claimed, err := a.GPU.CreateGPUInstance(ctx, g.UUID, p3g, gpu.Placement{Start: 0, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.GPU.CreateComputeInstance(ctx, g.UUID, claimed.GIID); err != nil {
		t.Fatal(err)
	}
	held := []gpu.Placement{{Start: 0, Size: 4}}
	want := wants("3g.40gb x1")
	if ok, err := a.SatisfiedAround(ctx, g.UUID, want, held); err != nil || ok {
		t.Fatalf("SatisfiedAround = %v, %v; the claim's instance must not count as the layout's", ok, err)
	}
	g.Calls()
	if _, err := a.ApplyAround(ctx, g.UUID, want, held); err != nil {
		t.Fatal(err)
	}
	if calls := g.Calls(); !reflect.DeepEqual(calls, []string{"CreateGpuInstance(profile 9 at 4+4)", "CreateComputeInstance(GI 1)"}) {
		t.Errorf("NVML calls %q; want the fixed 3g.40gb created at 4 and nothing destroyed", calls)
	}
	if ok, err := a.SatisfiedAround(ctx, g.UUID, want, held); err != nil || !ok {
		t.Errorf("SatisfiedAround after the apply = %v, %v", ok, err)
	}
	// A layout that needs the claim's slices does not fit, and says what holds them.
	err = CheckAround(d, wants("3g.40gb x2"), held)
	if err == nil || !contains(err.Error(), "slices 0-3 are taken by a claim's instance") {
		t.Errorf("CheckAround(3g.40gb x2) = %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// migH100 is a mocked H100 in MIG mode with no instance, its applier, and the device as NVML reads it.
func migH100(t *testing.T) (*nvmlmock.GPU, *Applier, gpu.Device) {
	t.Helper()
	s := nvmlmock.NewH100(1)
	g := s.GPUs[0]
	g.SetMIGMode(true, true)
	a := &Applier{GPU: gpu.NewNVML(s)}
	d, err := a.GPU.Device(context.Background(), g.UUID)
	if err != nil {
		t.Fatal(err)
	}
	return g, a, d
}
