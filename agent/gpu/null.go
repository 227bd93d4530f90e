package gpu

import (
	"context"
	"fmt"
)

// Null is the GPU implementation of a node without NVML: every call fails with ErrUnavailable and the
// reason NVML could not start, so the agent reports Ready=False NVMLUnavailable instead of crash-looping.
type Null struct {
	// Cause is why NVML is unavailable (the library could not load, the driver is missing).
	Cause error
}

var _ Interface = Null{}

func (n Null) err() error {
	if n.Cause == nil {
		return ErrUnavailable
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, n.Cause)
}

// Inventory implements Interface.
func (n Null) Inventory(context.Context) (Inventory, error) { return Inventory{}, n.err() }

// Device implements Interface.
func (n Null) Device(context.Context, string) (Device, error) { return Device{}, n.err() }

// SetMIGMode implements Interface.
func (n Null) SetMIGMode(context.Context, string, bool) error { return n.err() }

// CreateGPUInstance implements Interface.
func (n Null) CreateGPUInstance(context.Context, string, Profile, Placement) (Instance, error) {
	return Instance{}, n.err()
}

// CreateComputeInstance implements Interface.
func (n Null) CreateComputeInstance(context.Context, string, int) (Instance, error) {
	return Instance{}, n.err()
}

// DestroyInstance implements Interface.
func (n Null) DestroyInstance(context.Context, string, int) error { return n.err() }

// SetComputeMode implements Interface.
func (n Null) SetComputeMode(context.Context, string, ComputeMode) error { return n.err() }
