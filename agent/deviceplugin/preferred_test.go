package deviceplugin

import (
	"reflect"
	"testing"
	"time"
)

func TestPreferredAllocation(t *testing.T) {
	// GPU-a and GPU-b have 4 time-slice replicas each, GPU-c 2.
	ts := DevicesFromStatus(nodeStatus(gpu(0, "GPU-a", timeSliced(4)), gpu(1, "GPU-b", timeSliced(4)), gpu(2, "GPU-c", timeSliced(2))), Config{})["gpusharing.io/gpu-timeslice"]
	mp := DevicesFromStatus(nodeStatus(gpu(0, "GPU-a", mps(4, 25, "", "Running")), gpu(1, "GPU-b", mps(4, 25, "", "Running"))), Config{})["gpusharing.io/gpu-mps"]
	sh := DevicesFromStatus(nodeStatus(gpu(0, "GPU-a", shim(time.Second)), gpu(1, "GPU-b", shim(time.Second))), Config{})["gpusharing.io/gpu-shared"]
	ex := DevicesFromStatus(nodeStatus(gpu(0, "GPU-a"), gpu(1, "GPU-b"), gpu(2, "GPU-c")), Config{})["nvidia.com/gpu"]
	allIDs := func(devs []Device) []string {
		var ids []string
		for _, d := range devs {
			ids = append(ids, d.ID)
		}
		return ids
	}
	cases := []struct {
		name        string
		all         []Device
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
			name: "shim shares pack onto one GPU",
			all:  sh, available: allIDs(sh), size: 2,
			want: []string{"GPU-a::0", "GPU-a::1"},
		},
		{
			name: "whole GPUs are taken in advertised order",
			all:  ex, available: []string{"GPU-c", "GPU-a"}, size: 1,
			want: []string{"GPU-a"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := preferredAllocation(tc.all, tc.available, tc.mustInclude, tc.size)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
