package gpu_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

func TestInventoryReadsIdentityAndMIGProfilesFromNVML(t *testing.T) {
	tests := []struct {
		name         string
		server       *nvmlmock.Server
		product      string
		profiles     []string
		threeSlice   gpu.Placement // the second placement NVML offers for the 3-slice profile
		driver, cuda string
	}{
		{
			name:       "dgx a100",
			server:     nvmlmock.NewA100(2),
			product:    "NVIDIA A100-SXM4-40GB",
			profiles:   []string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
			threeSlice: gpu.Placement{Start: 4, Size: 4},
			driver:     "550.54.15", cuda: "12.4",
		},
		{
			name:       "dgx h100 (the real H100's recorded profiles)",
			server:     nvmlmock.NewH100(2),
			product:    "NVIDIA H100 80GB HBM3",
			profiles:   []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			threeSlice: gpu.Placement{Start: 4, Size: 4},
			driver:     "580.159.04", cuda: "13.0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv, err := gpu.NewNVML(tt.server).Inventory(context.Background())
			if err != nil {
				t.Fatalf("Inventory: %v", err)
			}
			if len(inv.Devices) != 2 || inv.DriverVersion != tt.driver || inv.CUDAVersion != tt.cuda {
				t.Fatalf("inventory = %d devices, driver %q, cuda %q; want 2, %q, %q", len(inv.Devices), inv.DriverVersion, inv.CUDAVersion, tt.driver, tt.cuda)
			}
			d := inv.Devices[1]
			// The mock's minor numbers follow the index; the device node is /dev/nvidia<minor>.
			if d.Index != 1 || d.Minor != 1 || d.UUID != tt.server.GPUs[1].UUID || d.Product != tt.product || !d.MIGCapable || d.ComputeMode != gpu.ComputeModeDefault {
				t.Errorf("device = %+v", d)
			}
			var names []string
			for _, p := range d.Profiles {
				names = append(names, p.Name)
			}
			if !reflect.DeepEqual(names, tt.profiles) {
				t.Errorf("profiles = %v, want %v", names, tt.profiles)
			}
			p, _ := d.Profile(tt.profiles[4])
			if len(p.Placements) != 2 || p.Placements[1] != tt.threeSlice {
				t.Errorf("%s placements = %v, want the second at %v", p.Name, p.Placements, tt.threeSlice)
			}
		})
	}
}

func TestInventoryOfGPUWithoutMIGHasNoProfiles(t *testing.T) {
	s := nvmlmock.NewA100(1)
	s.GPUs[0].SetMIGCapable(false)
	s.GPUs[0].SetProcesses(42, 43)
	inv, err := gpu.NewNVML(s).Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d := inv.Devices[0]
	if d.MIGCapable || len(d.Profiles) != 0 || !reflect.DeepEqual(d.PIDs(), []int32{42, 43}) {
		t.Errorf("device = %+v, want not MIG-capable, no profiles, pids [42 43]", d)
	}
}

func TestCreateAndDestroyInstancesShowInTheSnapshot(t *testing.T) {
	ctx := context.Background()
	s := nvmlmock.NewA100(1)
	s.GPUs[0].SetMIGMode(true, true)
	g := gpu.NewNVML(s)
	uuid := s.GPUs[0].UUID
	d, _ := g.Device(ctx, uuid)
	p, _ := d.Profile("3g.20gb")
	gi, err := g.CreateGPUInstance(ctx, uuid, p, gpu.Placement{Start: 4, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.CreateComputeInstance(ctx, uuid, gi.GIID); err != nil {
		t.Fatal(err)
	}
	d, _ = g.Device(ctx, uuid)
	if len(d.Instances) != 1 || d.Instances[0].Profile != "3g.20gb" || d.Instances[0].CIID == gpu.NoComputeInstance || d.Instances[0].UUID == "" {
		t.Fatalf("instances = %+v, want one 3g.20gb with a compute instance and uuid", d.Instances)
	}
	if err := g.DestroyInstance(ctx, uuid, gi.GIID); err != nil {
		t.Fatal(err)
	}
	if d, _ = g.Device(ctx, uuid); len(d.Instances) != 0 {
		t.Errorf("instances after destroy = %+v", d.Instances)
	}
}

func TestNVMLErrorsKeepTheReturnCodeAndSuccessIsNoError(t *testing.T) {
	s := nvmlmock.NewA100(1)
	s.GPUs[0].SetMIGMode(false, false)
	g := gpu.NewNVML(s)
	_, err := g.CreateGPUInstance(context.Background(), s.GPUs[0].UUID, gpu.Profile{Type: 0, Name: "1g.5gb"}, gpu.Placement{Start: 0, Size: 1})
	if !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) || !gpu.IsNVMLError(err) {
		t.Errorf("create with MIG off: err = %v, want an NVMLError matching ERROR_NOT_SUPPORTED", err)
	}
	if err := g.SetMIGMode(context.Background(), s.GPUs[0].UUID, true); err != nil {
		t.Errorf("SetMIGMode returned %v; nvml.SUCCESS must become nil", err)
	}
}

func TestNullReportsUnavailableWithItsCause(t *testing.T) {
	cause := errors.New("libnvidia-ml.so.1: cannot open shared object file")
	_, err := gpu.Null{Cause: cause}.Inventory(context.Background())
	if !errors.Is(err, gpu.ErrUnavailable) || !errors.Is(err, cause) {
		t.Errorf("err = %v, want ErrUnavailable wrapping the cause", err)
	}
}
