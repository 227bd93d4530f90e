package accounting

import (
	"context"
	"fmt"
	"maps"
	"strings"
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
		"gpusharing_pod_gpus{ml/a,,,node-1}":                                       1,
		"gpusharing_pod_gpus{ml/b,,,node-1}":                                       1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("series = %v, want exactly %d", got, len(want))
	}

	// Pod b leaves: its six series go at the next sample, pod a's stay.
	g0.SetUsage(nvmlmock.Proc(100, 3*gib, 40))
	delete(s, g0.UUID)
	a.Sample(context.Background())
	got = prom.Gathered(t, reg, "container")
	for k := range got {
		if k != "gpusharing_pod_gpu_memory_used_bytes{ml/a,train,"+u+",node-1}" && k != "gpusharing_pod_gpu_sm_utilization_percent{ml/a,train,"+u+",node-1}" &&
			k != "gpusharing_pod_gpus{ml/a,,,node-1}" {
			t.Errorf("series %s outlived its pod", k)
		}
	}
	if len(got) != 3 {
		t.Errorf("series = %v, want pod a's three", got)
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
	reg := exportOnNodeN(a, 4)
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

// A pod on two GPUs counts 2 in gpusharing_pod_gpus, and the series goes when the pod's processes
// leave both GPUs.
func TestPodGPUsCountsAPodsGPUsAndLeavesWithIt(t *testing.T) {
	srv := nvmlmock.NewH100(3)
	srv.GPUs[0].SetUsage(nvmlmock.Proc(100, gib, 0))
	srv.GPUs[1].SetUsage(nvmlmock.Proc(101, gib, 0), nvmlmock.Proc(200, gib, 0))
	a := newAccountant(srv, pods{100: ref("ml", "tp", "rank0"), 101: ref("ml", "tp", "rank1"), 200: ref("ml", "one", "c")}, nil)
	reg := exportOnNodeN(a, 0)
	a.Sample(context.Background())
	count := func() map[string]float64 {
		out := map[string]float64{}
		for k, v := range prom.Gathered(t, reg, "container") {
			if strings.HasPrefix(k, "gpusharing_pod_gpus{") {
				out[k] = v
			}
		}
		return out
	}
	want := map[string]float64{"gpusharing_pod_gpus{ml/tp,,,n}": 2, "gpusharing_pod_gpus{ml/one,,,n}": 1}
	if got := count(); !maps.Equal(got, want) {
		t.Errorf("pod GPU series = %v, want %v", got, want)
	}
	srv.GPUs[0].SetUsage()
	srv.GPUs[1].SetUsage(nvmlmock.Proc(200, gib, 0))
	a.Sample(context.Background())
	want = map[string]float64{"gpusharing_pod_gpus{ml/one,,,n}": 1}
	if got := count(); !maps.Equal(got, want) {
		t.Errorf("after tp left: pod GPU series = %v, want %v", got, want)
	}
}

// A pod whose containers the per-GPU cap leaves out exports no GPU count either, so the cap bounds
// every per-pod series.
func TestPodGPUsIsBoundedByThePerGPUCap(t *testing.T) {
	srv := nvmlmock.NewH100(1)
	srv.GPUs[0].SetUsage(nvmlmock.Proc(100, 2*gib, 0), nvmlmock.Proc(200, gib, 0))
	a := newAccountant(srv, pods{100: ref("ml", "big", "c"), 200: ref("ml", "small", "c")}, nil)
	reg := exportOnNodeN(a, 1)
	a.Sample(context.Background())
	got := prom.Gathered(t, reg, "container")
	if _, ok := got["gpusharing_pod_gpus{ml/small,,,n}"]; ok {
		t.Errorf("the capped-out pod exports its GPU count: %v", got)
	}
	if got["gpusharing_pod_gpus{ml/big,,,n}"] != 1 {
		t.Errorf("the exported pod's GPU count is missing: %v", got)
	}
}

// exportOnNodeN registers a's series as node "n", at most maxPerGPU containers a GPU (0: the default).
func exportOnNodeN(a *Accountant, maxPerGPU int) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	m, _ := NewMetrics(reg)
	m.MaxSeriesPerGPU = maxPerGPU
	m.Add("n", a)
	return reg
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
