package nvmlmock_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

func profile(t *testing.T, d gpu.Device, name string) gpu.Profile {
	t.Helper()
	for _, p := range d.Profiles {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no profile %s", name)
	return gpu.Profile{}
}

// A second process (a second server over the same file) finds the GPUs as the first left them: MIG mode,
// each GPU instance at its placement with its id, a GI left without its compute instance, compute mode;
// and the ids it creates next do not reuse the first's.
func TestPersistedGPUsOutliveTheServerThatChangedThem(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gpus.json")
	first, err := nvmlmock.NewNode("H100", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Persist(path, nvmlmock.PersistOptions{}); err != nil {
		t.Fatal(err)
	}
	g1 := gpu.NewNVML(first)
	uuid := first.GPUs[1].Device.UUID
	if err := g1.SetMIGMode(ctx, uuid, true); err != nil {
		t.Fatal(err)
	}
	d, err := g1.Device(ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}
	p3 := profile(t, d, "3g.40gb")
	gi, err := g1.CreateGPUInstance(ctx, uuid, p3, p3.Placements[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g1.CreateComputeInstance(ctx, uuid, gi.GIID); err != nil {
		t.Fatal(err)
	}
	p1 := profile(t, d, "1g.10gb")
	half, err := g1.CreateGPUInstance(ctx, uuid, p1, p1.Placements[len(p1.Placements)-1])
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.SetComputeMode(ctx, first.GPUs[0].Device.UUID, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	before, err := g1.Device(ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}

	second, err := nvmlmock.NewNode("H100", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Persist(path, nvmlmock.PersistOptions{}); err != nil {
		t.Fatal(err)
	}
	g2 := gpu.NewNVML(second)
	after, err := g2.Device(ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}
	if !after.MIGMode.Current || !after.MIGMode.Pending {
		t.Errorf("MIG mode after the restart: %+v, want on", after.MIGMode)
	}
	if got, want := mig(after.Instances), mig(before.Instances); got != want {
		t.Errorf("instances after the restart: %s, want %s", got, want)
	}
	if !strings.Contains(mig(after.Instances), "gi"+strconv.Itoa(half.GIID)+" ci-") {
		t.Errorf("the GI created without a compute instance came back as %s", mig(after.Instances))
	}
	d0, err := g2.Device(ctx, second.GPUs[0].Device.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if d0.ComputeMode != gpu.ComputeModeExclusiveProcess {
		t.Errorf("compute mode after the restart: %v", d0.ComputeMode)
	}
	// The next GI id continues the first server's count.
	next, err := g2.CreateGPUInstance(ctx, uuid, p1, p1.Placements[len(p1.Placements)-2])
	if err != nil {
		t.Fatal(err)
	}
	if next.GIID <= half.GIID {
		t.Errorf("the restarted server reused GI id %d (the first made %d)", next.GIID, half.GIID)
	}
	journal, err := os.ReadFile(nvmlmock.JournalPath(path))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(journal)), "\n")
	if len(lines) != 6 {
		t.Errorf("journal has %d lines, want 6 (one per mutation of both servers):\n%s", len(lines), journal)
	}
}

func mig(ins []gpu.Instance) string {
	var b strings.Builder
	for _, in := range ins {
		b.WriteString(in.Profile + "@" + in.Placement.String() + " gi" + strconv.Itoa(in.GIID) + " ci" + strconv.Itoa(in.CIID) + ";")
	}
	return b.String()
}
