package mig

import (
	"context"
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// On the H100's geometry a fixed 3g.40gb fits at 0-3 or 4-7: with claims at 0-1 (2g.20gb) and 6
// (1g.10gb) it fits around neither, so the plan gives up one claim, the first whose slices suffice,
// and keeps the other; a layout that fits around both gives up none; one that fits nowhere is refused.
func TestMakePlanGivingUpGivesUpTheFewestClaims(t *testing.T) {
	inv, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	profiles := inv.Devices[0].Profiles
	held := []gpu.Placement{{Start: 0, Size: 2}, {Start: 6, Size: 1}}
	plan, gone, err := MakePlanGivingUp(profiles, nil, wants("3g.40gb x1"), held)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gone, []gpu.Placement{{Start: 0, Size: 2}}) || len(plan.Create) != 1 || plan.Create[0].At != (gpu.Placement{Start: 0, Size: 4}) {
		t.Errorf("gave up %v, creates %+v; want the claim at 0-1 given up and 3g.40gb at 0-3", gone, plan.Create)
	}
	if _, gone, err := MakePlanGivingUp(profiles, nil, wants("1g.10gb x2"), held); err != nil || len(gone) != 0 {
		t.Errorf("two 1g.10gb beside both claims: gave up %v, %v; want none", gone, err)
	}
	if _, _, err := MakePlanGivingUp(profiles, nil, wants("7g.80gb x1 + 1g.10gb x1"), held); err == nil {
		t.Error("a layout that fits no GPU was planned")
	}
}

// A fixed instance the new layout destroys goes while a claim's instance beside it runs a process:
// only processes on the instances the plan destroys keep it from destroying them.
func TestApplyAroundDestroysAnIdleFixedInstanceBesideABusyClaim(t *testing.T) {
	ctx := context.Background()
	g, a, d := migH100(t)
	create := func(profile string, at gpu.Placement) gpu.Instance {
		p, _ := d.Profile(profile)
		in, err := a.GPU.CreateGPUInstance(ctx, g.UUID, p, at)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.GPU.CreateComputeInstance(ctx, g.UUID, in.GIID); err != nil {
			t.Fatal(err)
		}
		return in
	}
	claim := create("3g.40gb", gpu.Placement{Start: 0, Size: 4})
	fixed := create("1g.10gb", gpu.Placement{Start: 6, Size: 1})
	held := []gpu.Placement{{Start: 0, Size: 4}}
	g.SetUsage(nvmlmock.Process{PID: 42, Memory: 1 << 30, GI: claim.GIID, CI: 0})
	if _, err := a.ApplyAround(ctx, g.UUID, wants("2g.20gb x1"), held); err != nil {
		t.Fatalf("the change beside the claim's busy instance: %v", err)
	}
	if d, _ = a.GPU.Device(ctx, g.UUID); Summary(d.Instances) != "3g.40gb,2g.20gb" {
		t.Errorf("instances %s; want the claim's 3g.40gb kept and the fixed 1g.10gb replaced by a 2g.20gb", Summary(d.Instances))
	}
	// A process on the instance the plan destroys still refuses it.
	for _, in := range d.Instances {
		if in.Profile == "2g.20gb" {
			fixed = in
		}
	}
	g.SetUsage(nvmlmock.Process{PID: 43, Memory: 1 << 30, GI: fixed.GIID, CI: 0})
	if _, err := a.ApplyAround(ctx, g.UUID, wants("1g.10gb x1"), held); err == nil {
		t.Error("a fixed instance with a process on it was destroyed")
	}
}
