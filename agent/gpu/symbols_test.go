package gpu_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// lackFunctions makes the mock a driver library without syms: LookupSymbol fails for them, and the
// methods that would call them panic, as the real library ends the process ("symbol lookup error").
func lackFunctions(s *nvmlmock.Server, syms ...string) {
	lacks := map[string]bool{}
	for _, sym := range syms {
		lacks[sym] = true
	}
	s.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
			if lacks[name] {
				return fmt.Errorf("undefined symbol: %s", name)
			}
			return nil
		}}
	}
	for _, g := range s.GPUs {
		if lacks["nvmlDeviceGetMemoryInfo_v2"] {
			g.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
				panic("symbol lookup error: undefined symbol: nvmlDeviceGetMemoryInfo_v2")
			}
		}
		if lacks["nvmlDeviceGetMigMode"] {
			g.GetMigModeFunc = func() (int, int, nvml.Return) {
				panic("symbol lookup error: undefined symbol: nvmlDeviceGetMigMode")
			}
		}
	}
	if lacks["nvmlDeviceGetHandleByUUID"] {
		s.DeviceGetHandleByUUIDFunc = func(string) (nvml.Device, nvml.Return) {
			panic("symbol lookup error: undefined symbol: nvmlDeviceGetHandleByUUID")
		}
	}
}

// An older driver's library lacks functions newer drivers have (nvmlDeviceGetMemoryInfo_v2 since R510,
// MIG's since R450). The agent must read what it can and report the rest, never call what is missing:
// go-nvml's call of a missing function ends the process.
func TestFunctionsTheDriverLacksAreNeverCalled(t *testing.T) {
	s := nvmlmock.NewA100(2)
	s.GPUs[0].SetMemoryReserved(1 << 30)
	lackFunctions(s, "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMigMode", "nvmlDeviceGetHandleByUUID")
	n := gpu.NewNVML(s)
	want := []string{"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMigMode"}
	if got := n.MissingFunctions(); !reflect.DeepEqual(got, want) {
		t.Errorf("MissingFunctions = %v, want %v", got, want)
	}
	inv, err := n.Inventory(context.Background())
	if err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	d := inv.Devices[0]
	// Without the reserve and MIG functions: the GPU is read, its reserve unknown (0), MIG unsupported.
	if len(inv.Devices) != 2 || d.UUID != s.GPUs[0].UUID || d.MemoryBytes == 0 || d.MemoryReservedBytes != 0 || d.MIGCapable || len(d.Profiles) != 0 {
		t.Errorf("device = %+v", d)
	}
	// A lookup by uuid is an error the caller reports, not a call.
	if _, err := n.Device(context.Background(), s.GPUs[1].UUID); err == nil {
		t.Error("Device by uuid without nvmlDeviceGetHandleByUUID: no error")
	}
}

// A library that has every function is used as it is: no guard between the agent and go-nvml.
func TestACompleteLibraryMissesNothing(t *testing.T) {
	s := nvmlmock.NewA100(1)
	lackFunctions(s)
	n := gpu.NewNVML(s)
	if got := n.MissingFunctions(); len(got) != 0 {
		t.Errorf("MissingFunctions = %v", got)
	}
	inv, err := n.Inventory(context.Background())
	if err != nil || !inv.Devices[0].MIGCapable {
		t.Fatalf("Inventory = %+v, %v", inv, err)
	}
}
