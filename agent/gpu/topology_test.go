package gpu_test

import (
	"context"
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

// The links between GPUs come from NVML: NVLinks through NVSwitches on a DGX, NVLink bridges counted
// per pair on a PCIe server, and the closest PCIe ancestor of every pair.
func TestTopologyReadsNVLinksAndPCIePathsFromNVML(t *testing.T) {
	bridged := nvmlmock.NewH100(4)
	bridged.SetTopology(nvmlmock.Topology{Bridges: map[[2]int]int{{0, 1}: 4, {2, 3}: 2}, PCIe: func(a, b int) nvml.GpuTopologyLevel {
		if a/2 == b/2 {
			return nvml.TOPOLOGY_HOSTBRIDGE
		}
		return nvml.TOPOLOGY_SYSTEM
	}})
	for _, tt := range []struct {
		name   string
		server *nvmlmock.Server
		want   map[[2]int]gpu.Link
	}{
		{"dgx h100", nvmlmock.NewH100(8), map[[2]int]gpu.Link{
			{0, 1}: {NVLinks: 18, PCIe: gpu.PCIeSwitches}, {0, 2}: {NVLinks: 18, PCIe: gpu.PCIeNode}, {3, 4}: {NVLinks: 18, PCIe: gpu.PCIeSystem}}},
		{"dgx a100", nvmlmock.NewA100(4), map[[2]int]gpu.Link{{2, 3}: {NVLinks: 12, PCIe: gpu.PCIeSwitches}}},
		{"pcie server with bridges", bridged, map[[2]int]gpu.Link{
			{0, 1}: {NVLinks: 4, PCIe: gpu.PCIeHostBridge}, {2, 3}: {NVLinks: 2, PCIe: gpu.PCIeHostBridge}, {1, 2}: {PCIe: gpu.PCIeSystem}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := gpu.NewNVML(tt.server).Topology(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for p, want := range tt.want {
				a, b := tt.server.GPUs[p[0]].Device.UUID, tt.server.GPUs[p[1]].Device.UUID
				got, ok := topo.Between(b, a)
				if !ok || got != want {
					t.Errorf("GPUs %d and %d: %+v (known %v), want %+v", p[0], p[1], got, ok, want)
				}
			}
		})
	}
}

func TestLinksRankNVLinkBeforePCIe(t *testing.T) {
	nv4 := gpu.Link{NVLinks: 4, PCIe: gpu.PCIeSystem}
	nv2 := gpu.Link{NVLinks: 2, PCIe: gpu.PCIeSwitch}
	pix := gpu.Link{PCIe: gpu.PCIeSwitch}
	sys := gpu.Link{PCIe: gpu.PCIeSystem}
	if !nv4.Closer(nv2) || !nv2.Closer(pix) || !pix.Closer(sys) || sys.Closer(pix) || pix.Closer(pix) {
		t.Error("want NV4 > NV2 > PIX > SYS, and no link closer than itself")
	}
}

func TestNullKnowsNoTopology(t *testing.T) {
	topo, err := gpu.Null{}.Topology(context.Background())
	if !errors.Is(err, gpu.ErrUnavailable) || !topo.Empty() {
		t.Errorf("Null: %v, empty %v; want ErrUnavailable and no links", err, topo.Empty())
	}
}
