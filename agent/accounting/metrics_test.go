package accounting

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/test/prom"
)

func TestPodSeriesLeaveWithThePod(t *testing.T) {
	srv := nvmlmock.NewH100(1)
	g0 := srv.GPUs[0]
	g0.SetUsage(nvmlmock.Proc(100, 3*gib, 40), nvmlmock.Proc(200, gib, 10))
	g0.AdvanceSamples(1)
	s := shims{g0.UUID: {{PID: 200, LockWait: 1500e6, LockHold: 2500e6, SwappedBytes: 512 << 20}}}
	a := newAccountant(srv, pods{100: ref("ml", "a", "train"), 200: ref("ml", "b", "serve")}, s)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Add("node-1", a)
	a.Sample(context.Background())

	got := prom.Gathered(t, reg, "container")
	u := g0.UUID
	want := map[string]float64{
		"gpusharing_pod_gpu_memory_used_bytes{ml/a,train," + u + ",node-1}":        3 * gib,
		"gpusharing_pod_gpu_sm_utilization_percent{ml/a,train," + u + ",node-1}":   40,
		"gpusharing_pod_gpu_memory_used_bytes{ml/b,serve," + u + ",node-1}":        gib,
		"gpusharing_pod_gpu_sm_utilization_percent{ml/b,serve," + u + ",node-1}":   10,
		"gpusharing_pod_shim_swapped_bytes{ml/b,serve," + u + ",node-1}":           512 << 20,
		"gpusharing_pod_shim_lock_wait_seconds_total{ml/b,serve," + u + ",node-1}": 1.5,
		"gpusharing_pod_shim_lock_hold_seconds_total{ml/b,serve," + u + ",node-1}": 2.5,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("series = %v, want exactly %d", got, len(want))
	}

	// Pod b leaves: its five series go at the next sample, pod a's stay.
	g0.SetUsage(nvmlmock.Proc(100, 3*gib, 40))
	delete(s, g0.UUID)
	a.Sample(context.Background())
	got = prom.Gathered(t, reg, "container")
	for k := range got {
		if k != "gpusharing_pod_gpu_memory_used_bytes{ml/a,train,"+u+",node-1}" && k != "gpusharing_pod_gpu_sm_utilization_percent{ml/a,train,"+u+",node-1}" {
			t.Errorf("series %s outlived its pod", k)
		}
	}
	if len(got) != 2 {
		t.Errorf("series = %v, want pod a's two", got)
	}
}

func TestPodSeriesPerGPUAreCapped(t *testing.T) {
	srv := nvmlmock.NewH100(2)
	p := pods{}
	var procs []nvmlmock.Process
	for i := 0; i < 10; i++ {
		pid := uint32(100 + i)
		procs = append(procs, nvmlmock.Proc(pid, uint64(i+1)*gib, 0))
		p[int32(pid)] = ref("ns", fmt.Sprintf("pod-%d", i), "c")
	}
	srv.GPUs[0].SetUsage(procs...)
	srv.GPUs[1].SetUsage(nvmlmock.Proc(900, gib, 0))
	p[900] = ref("ns", "alone", "c")
	a := newAccountant(srv, p, nil)
	reg := prometheus.NewRegistry()
	m, _ := NewMetrics(reg)
	m.MaxSeriesPerGPU = 4
	m.Add("n", a)
	a.Sample(context.Background())
	got := prom.Gathered(t, reg, "container")
	memory := map[string]int{}
	for k := range got {
		if len(k) > len("gpusharing_pod_gpu_memory_used_bytes") && k[:len("gpusharing_pod_gpu_memory_used_bytes")] == "gpusharing_pod_gpu_memory_used_bytes" {
			memory[k]++
		}
	}
	if len(memory) != 5 {
		t.Errorf("memory series = %v, want 4 on the crowded GPU and 1 on the other", memory)
	}
	// The four kept are the largest (pods 6-9); the six left out are counted.
	for i := 6; i < 10; i++ {
		k := fmt.Sprintf("gpusharing_pod_gpu_memory_used_bytes{ns/pod-%d,c,%s,n}", i, srv.GPUs[0].UUID)
		if _, ok := got[k]; !ok {
			t.Errorf("missing %s", k)
		}
	}
	if v := got["gpusharing_pod_series_omitted{/,,"+srv.GPUs[0].UUID+",n}"]; v != 6 {
		t.Errorf("omitted = %v, want 6 (got %v)", v, got)
	}
}

func TestMetricsAreSharedByTheAgentsOfAProcess(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := NewMetrics(reg)
	if err != nil || m1 != m2 {
		t.Errorf("second NewMetrics = %p, %v; want the first, %p", m2, err, m1)
	}
}
