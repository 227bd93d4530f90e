package deviceplugin

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuinfo "github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestPreferredAllocation(t *testing.T) {
	// GPU-a and GPU-b have 4 time-slice replicas each, GPU-c 2.
	ts := share.DevicesFromStatus(sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(4)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(4)), sharetest.GPU(2, "GPU-c", sharetest.TimeSliced(2))), share.Config{})["gpusharing.io/gpu-timeslice"]
	mp := share.DevicesFromStatus(sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(4, 25, "", "Running")), sharetest.GPU(1, "GPU-b", sharetest.MPS(4, 25, "", "Running"))), share.Config{})["gpusharing.io/gpu-mps"]
	sh := share.DevicesFromStatus(sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.Shim(time.Second)), sharetest.GPU(1, "GPU-b", sharetest.Shim(time.Second))), share.Config{})["gpusharing.io/gpu-shared"]
	ex := share.DevicesFromStatus(sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"), sharetest.GPU(1, "GPU-b"), sharetest.GPU(2, "GPU-c")), share.Config{})["nvidia.com/gpu"]
	allIDs := func(devs []share.Device) []string {
		var ids []string
		for _, d := range devs {
			ids = append(ids, d.ID)
		}
		return ids
	}
	cases := []struct {
		name        string
		all         []share.Device
		available   []string
		mustInclude []string
		size        int
		want        []string
	}{
		{
			name: "time-slice replicas spread over three GPUs when nothing is in use",
			all:  ts, available: allIDs(ts), size: 3,
			want: []string{"GPU-a::0", "GPU-b::0", "GPU-c::0"},
		},
		{
			name: "time-slice replicas go to the least used GPU first",
			// GPU-a has 3 of 4 in use, GPU-b 1 of 4, GPU-c none.
			all: ts, available: []string{"GPU-a::3", "GPU-b::1", "GPU-b::2", "GPU-b::3", "GPU-c::0", "GPU-c::1"}, size: 2,
			want: []string{"GPU-c::0", "GPU-b::1"},
		},
		{
			name: "time-slice replicas double up only when every GPU has one",
			all:  ts, available: allIDs(ts), size: 5,
			want: []string{"GPU-a::0", "GPU-b::0", "GPU-c::0", "GPU-a::1", "GPU-b::1"},
		},
		{
			name: "a must-include replica counts against its GPU",
			all:  ts, available: allIDs(ts), mustInclude: []string{"GPU-b::2"}, size: 2,
			want: []string{"GPU-b::2", "GPU-a::0"},
		},
		{
			name: "MPS shares pack onto the least used GPU that holds the whole request",
			all:  mp, available: []string{"GPU-a::2", "GPU-a::3", "GPU-b::0", "GPU-b::1", "GPU-b::3"}, size: 2,
			want: []string{"GPU-b::0", "GPU-b::1"},
		},
		{
			name: "MPS shares stay on the GPU of a must-include share",
			all:  mp, available: allIDs(mp), mustInclude: []string{"GPU-b::3"}, size: 3,
			want: []string{"GPU-b::3", "GPU-b::0", "GPU-b::1"},
		},
		{
			name: "shim shares go to distinct GPUs",
			all:  sh, available: allIDs(sh), size: 2,
			want: []string{"GPU-a::0", "GPU-b::0"},
		},
		{
			name: "shim shares double up only when fewer GPUs than shares have one free",
			all:  sh, available: allIDs(sh), size: 3,
			want: []string{"GPU-a::0", "GPU-b::0", "GPU-a::1"},
		},
		{
			name: "whole GPUs are taken in advertised order",
			all:  ex, available: []string{"GPU-c", "GPU-a"}, size: 1,
			want: []string{"GPU-a"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := preferredAllocation(tc.all, tc.available, tc.mustInclude, tc.size, gpuinfo.Topology{})
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// A container's shares go to the GPUs whose farthest pair is closest: NVLink before PCIe, a shared PCIe
// switch before the CPU interconnect, with the topology read from the mock servers through NVML.
func TestPreferredAllocationFollowsTheTopology(t *testing.T) {
	// Four GPUs of a PCIe server with NVLink bridges 0-1 (4 links) and 2-3 (2 links), each pair under
	// one host bridge, the pairs on two NUMA nodes.
	bridged := nvmlmock.NewH100(4)
	bridged.SetTopology(nvmlmock.Topology{Bridges: map[[2]int]int{{0, 1}: 4, {2, 3}: 2}, PCIe: func(a, b int) nvml.GpuTopologyLevel {
		if a/2 == b/2 {
			return nvml.TOPOLOGY_HOSTBRIDGE
		}
		return nvml.TOPOLOGY_SYSTEM
	}})
	dgx := nvmlmock.NewH100(8) // NVSwitch; PCIe: pairs under one switch tree, four per NUMA node
	for _, tt := range []struct {
		name        string
		server      *nvmlmock.Server
		full        map[int]int // GPU index -> replicas in use (taken from the front)
		mustInclude []int       // GPU indices whose replica 0 the kubelet must include
		size        int
		want        []int // GPU index of each pick
	}{
		{name: "two shares take the pair joined by most NVLinks, the less used GPU first",
			server: bridged, full: map[int]int{0: 3}, size: 2, want: []int{1, 0}},
		{name: "with GPU 0 full, two shares take the other NVLink pair",
			server: bridged, full: map[int]int{0: 4}, size: 2, want: []int{2, 3}},
		{name: "a must-include share on GPU 2 brings its NVLink partner, not the first GPU",
			server: bridged, mustInclude: []int{2}, size: 2, want: []int{2, 3}},
		{name: "on NVSwitch every pair is NVLink: a must-include on GPU 5 brings GPU 4, under the same PCIe switch",
			server: dgx, mustInclude: []int{5}, size: 2, want: []int{5, 4}},
		{name: "four shares on a DGX stay within one NUMA node",
			server: dgx, mustInclude: []int{6}, size: 4, want: []int{6, 4, 5, 7}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var gs []v1alpha1.GPUStatus
			for i, g := range tt.server.GPUs {
				gs = append(gs, sharetest.GPU(int32(i), g.Device.UUID, sharetest.Shim(time.Second)))
			}
			all := share.DevicesFromStatus(sharetest.NodeStatus(gs...), share.Config{})["gpusharing.io/gpu-shared"]
			var ids []string
			for _, d := range all {
				if int(d.Replica) >= tt.full[int(d.GPUIndex)] {
					ids = append(ids, d.ID)
				}
			}
			topo, err := gpuinfo.NewNVML(tt.server).Topology(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var must []string
			for _, i := range tt.mustInclude {
				must = append(must, share.ReplicaID(tt.server.GPUs[i].Device.UUID, 0))
			}
			got := preferredAllocation(all, ids, must, tt.size, topo)
			index := map[string]int{}
			for i, g := range tt.server.GPUs {
				index[g.Device.UUID] = i
			}
			var gotGPUs []int
			for _, id := range got {
				gotGPUs = append(gotGPUs, index[share.GPUOfDeviceID(id)])
			}
			if !reflect.DeepEqual(gotGPUs, tt.want) {
				t.Errorf("picked GPUs %v (%v), want %v", gotGPUs, got, tt.want)
			}
		})
	}
}

// The manager hands its plugins the topology it is given: over gRPC, a share that must stay on GPU 2
// brings GPU 3, its NVLink partner, where without the topology GPU 0 would come first.
func TestPreferredAllocationReadsTheTopologyOverGRPC(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	srv := nvmlmock.NewH100(4)
	srv.SetTopology(nvmlmock.Topology{Bridges: map[[2]int]int{{0, 1}: 4, {2, 3}: 4}, PCIe: func(int, int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_SYSTEM }})
	m.SetTopology(gpuinfo.NewNVML(srv))
	var gs []v1alpha1.GPUStatus
	for i, g := range srv.GPUs {
		gs = append(gs, sharetest.GPU(int32(i), g.Device.UUID, sharetest.Shim(time.Second)))
	}
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(gs...)); err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, d := range share.DevicesFromStatus(sharetest.NodeStatus(gs...), share.Config{})[resShared] {
		all = append(all, d.ID)
	}
	uuid := func(i int) string { return srv.GPUs[i].Device.UUID }
	got, err := dialPlugin(t, k, resShared).Preferred(ctx, all, []string{share.ReplicaID(uuid(2), 0)}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{share.ReplicaID(uuid(2), 0), share.ReplicaID(uuid(3), 0)}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
