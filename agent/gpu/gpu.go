package gpu

import (
	"context"
	"errors"
)

// Interface is everything the agent reads from and does to the GPUs.
type Interface interface {
	// Inventory reads a snapshot of every GPU. It returns ErrUnavailable (wrapped) when there is no NVML.
	Inventory(ctx context.Context) (Inventory, error)
	// Device reads a fresh snapshot of one GPU.
	Device(ctx context.Context, uuid string) (Device, error)
	// SetMIGMode asks for MIG mode on or off; the change may stay pending until a GPU reset, which the
	// caller sees in the next snapshot's MIGMode.
	SetMIGMode(ctx context.Context, uuid string, enabled bool) error
	// CreateGPUInstance creates a MIG GPU instance of the profile at the placement, without a compute
	// instance, and returns it.
	CreateGPUInstance(ctx context.Context, uuid string, profile Profile, at Placement) (Instance, error)
	// CreateComputeInstance creates the compute instance that spans the whole GPU instance giID.
	CreateComputeInstance(ctx context.Context, uuid string, giID int) (Instance, error)
	// DestroyInstance destroys GPU instance giID and its compute instances.
	DestroyInstance(ctx context.Context, uuid string, giID int) error
	// SetComputeMode sets the compute mode.
	SetComputeMode(ctx context.Context, uuid string, mode ComputeMode) error
}

// ErrUnavailable is returned when the node has no NVML library or driver.
var ErrUnavailable = errors.New("NVML is not available")

// ErrNotFound is returned when no GPU has the uuid asked for.
var ErrNotFound = errors.New("no GPU with that uuid")
