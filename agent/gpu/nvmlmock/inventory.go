package nvmlmock

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpusharing/gpusharing/agent/gpu"
)

// NewFromInventory returns a mock server whose n GPUs carry the identity and MIG profile data of a
// recorded device (an `agent inventory` dump from real hardware), so appliers run against real
// profile ids, sizes and placements rather than go-nvml's approximations.
func NewFromInventory(inv gpu.Inventory, dev gpu.Device, n int) *Server {
	arch, cudaMajor := architecture(dev.Product)
	cfg := gpus.Config{
		Name:         dev.Product,
		Architecture: nvml.DeviceArchitecture(arch),
		Brand:        nvml.BRAND_NVIDIA,
		MemoryMB:     dev.MemoryBytes >> 20,
		CudaMajor:    cudaMajor,
		MIGProfiles: gpus.MIGProfileConfig{
			GpuInstanceProfiles:       map[int]nvml.GpuInstanceProfileInfo{},
			ComputeInstanceProfiles:   map[int]map[int]nvml.ComputeInstanceProfileInfo{},
			GpuInstancePlacements:     map[int][]nvml.GpuInstancePlacement{},
			ComputeInstancePlacements: map[int]map[int][]nvml.ComputeInstancePlacement{},
		},
	}
	for _, p := range dev.Profiles {
		// As the driver does: asked by type, answered with the profile's own id; placements and compute
		// profiles are found by that id.
		cfg.MIGProfiles.GpuInstanceProfiles[p.Type] = nvml.GpuInstanceProfileInfo{
			Id: uint32(p.ID), SliceCount: uint32(p.SliceCount), InstanceCount: uint32(p.MaxInstances), MemorySizeMB: p.MemoryMB,
		}
		for _, pl := range p.Placements {
			cfg.MIGProfiles.GpuInstancePlacements[p.ID] = append(cfg.MIGProfiles.GpuInstancePlacements[p.ID],
				nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		if ci, ok := gpu.ComputeProfileForSlices(p.SliceCount); ok {
			cfg.MIGProfiles.ComputeInstanceProfiles[p.ID] = map[int]nvml.ComputeInstanceProfileInfo{
				ci: {Id: uint32(ci), SliceCount: uint32(p.SliceCount), InstanceCount: 1},
			}
			cfg.MIGProfiles.ComputeInstancePlacements[p.ID] = map[int][]nvml.ComputeInstancePlacement{
				ci: {{Start: 0, Size: uint32(p.SliceCount)}},
			}
		}
	}
	cuda := 0
	var major, minor int
	if _, err := fmt.Sscanf(inv.CUDAVersion, "%d.%d", &major, &minor); err == nil {
		cuda = major*1000 + minor*10
	}
	return wrap(server.NewServerWithGPUs(inv.DriverVersion, inv.DriverVersion, cuda, gpus.Multiple(n, cfg)...), n)
}
