package simnode_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/simnode"
)

// The demo's GPUs must be the real ones: a layout the planner refuses on a real H100 must be refused in
// the demo too, and one that fits must land on the same placements.
func TestSimulatedGPUsHaveTheRealMIGGeometry(t *testing.T) {
	for _, tt := range []struct {
		model, inventory string
	}{{"H100", nvmlmock.InventoryH100}, {"A100", nvmlmock.InventoryA100}} {
		t.Run(tt.model, func(t *testing.T) {
			rec, err := nvmlmock.Inventory(tt.inventory)
			if err != nil {
				t.Fatal(err)
			}
			server := simnode.NewServer(simnode.Node{Name: "n", Model: tt.model, GPUs: 2, Seq: 7})
			inv, err := gpu.NewNVML(server).Inventory(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range inv.Devices {
				if d.Product != rec.Devices[0].Product || !reflect.DeepEqual(d.Profiles, rec.Devices[0].Profiles) {
					t.Errorf("simulated GPU %d: %s %+v\nrecorded: %s %+v", d.Index, d.Product, d.Profiles, rec.Devices[0].Product, rec.Devices[0].Profiles)
				}
			}
		})
	}
}

func TestTheDemoRefusesWhatTheRealH100Refuses(t *testing.T) {
	rec, err := nvmlmock.Inventory(nvmlmock.InventoryH100)
	if err != nil {
		t.Fatal(err)
	}
	server := simnode.NewServer(simnode.Node{Name: "n", Model: "H100", GPUs: 1})
	sim, err := gpu.NewNVML(server).Device(context.Background(), server.GPUs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	layout := v1alpha1.MIGSharing{Instances: []v1alpha1.MIGInstanceRequest{{Profile: "1g.20gb", Count: 3}, {Profile: "3g.40gb", Count: 1}}}
	_, realErr := mig.MakePlan(rec.Devices[0].Profiles, nil, mig.Wants(layout))
	_, simErr := mig.MakePlan(sim.Profiles, nil, mig.Wants(layout))
	var realNF, simNF *mig.NoFitError
	if !errors.As(realErr, &realNF) || !errors.As(simErr, &simNF) {
		t.Fatalf("1g.20gb x3 + 3g.40gb: real H100 %v, simulated %v; want both refused", realErr, simErr)
	}
	if realNF.Message != simNF.Message {
		t.Errorf("refusals differ:\n real %s\n  sim %s", realNF.Message, simNF.Message)
	}
}
