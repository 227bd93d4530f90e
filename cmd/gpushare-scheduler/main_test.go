package main

import (
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/scheduler"
)

func TestParseGPUReadsQuantumGraceBudgetAndMode(t *testing.T) {
	cases := []struct {
		in   string
		want scheduler.GPUConfig
		bad  bool
	}{
		{in: "GPU-a:200ms", want: scheduler.GPUConfig{UUID: "GPU-a", SocketPath: "/d/GPU-a.sock", Quantum: 200 * time.Millisecond}},
		{in: "GPU-a:1s:500ms", want: scheduler.GPUConfig{UUID: "GPU-a", SocketPath: "/d/GPU-a.sock", Quantum: time.Second, Grace: 500 * time.Millisecond}},
		{in: "GPU-a:1s::16Gi:Always", want: scheduler.GPUConfig{UUID: "GPU-a", SocketPath: "/d/GPU-a.sock", Quantum: time.Second,
			Budget: 16 << 30, Mode: scheduler.ModeAlways}},
		{in: "GPU-a:1s:2s:4294967296", want: scheduler.GPUConfig{UUID: "GPU-a", SocketPath: "/d/GPU-a.sock", Quantum: time.Second,
			Grace: 2 * time.Second, Budget: 4 << 30}},
		{in: "GPU-a:1s::512Mi:off", want: scheduler.GPUConfig{UUID: "GPU-a", SocketPath: "/d/GPU-a.sock", Quantum: time.Second,
			Budget: 512 << 20, Mode: scheduler.ModeOff}},
		{in: "GPU-a", bad: true},
		{in: "GPU-a:1s::16GB", bad: true},
		{in: "GPU-a:1s::16Gi:Sometimes", bad: true},
		{in: "GPU-a:1s::1Gi:Auto:extra", bad: true},
	}
	for _, tc := range cases {
		got, err := parseGPU("/d", tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseGPU(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseGPU(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
