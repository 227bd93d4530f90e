package accounting

import (
	"context"
	"reflect"
	"testing"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
)

// A pod on two GPUs (a process per GPU, as NCCL jobs run, plus one process that NVML lists on both)
// shows on each GPU's account, and the per-pod view lists both GPUs with what the pod uses on each.
func TestAPodOnTwoGPUsShowsOnBoth(t *testing.T) {
	srv := nvmlmock.NewH100(3)
	srv.GPUs[0].SetUsage(nvmlmock.Proc(100, 2*gib, 40), nvmlmock.Proc(102, gib, 10))
	srv.GPUs[1].SetUsage(nvmlmock.Proc(101, 3*gib, 50), nvmlmock.Proc(102, gib, 5), nvmlmock.Proc(200, gib, 70))
	for _, g := range srv.GPUs[:2] {
		g.AdvanceSamples(1_000_000)
	}
	a := newAccountant(srv, pods{100: ref("ml", "tp", "rank0"), 101: ref("ml", "tp", "rank1"), 102: ref("ml", "tp", "rank0"), 200: ref("ml", "other", "c")}, nil)
	snap := a.Sample(context.Background())
	for i, want := range []uint64{3 * gib, 4 * gib} {
		g, _ := snap.GPU(srv.GPUs[i].UUID)
		var got uint64
		for _, c := range g.Containers {
			if c.Name == "tp" {
				got += c.MemoryBytes
			}
		}
		if got != want {
			t.Errorf("GPU %d: pod tp holds %d bytes, want %d", i, got, want)
		}
	}
	want := []Pod{
		{Namespace: "ml", Name: "other", GPUs: []PodGPU{{UUID: srv.GPUs[1].UUID, Index: 1, MemoryBytes: gib, MemoryComplete: true, SMPercent: 70, SMKnown: true}}},
		{Namespace: "ml", Name: "tp", GPUs: []PodGPU{
			{UUID: srv.GPUs[0].UUID, Index: 0, MemoryBytes: 3 * gib, MemoryComplete: true, SMPercent: 50, SMKnown: true},
			{UUID: srv.GPUs[1].UUID, Index: 1, MemoryBytes: 4 * gib, MemoryComplete: true, SMPercent: 55, SMKnown: true},
		}},
	}
	if got := snap.Pods(); !reflect.DeepEqual(got, want) {
		t.Errorf("pods:\n got %+v\nwant %+v", got, want)
	}
}

// Two containers of a pod on one GPU: the pod's figure there is their sum, its SM share at most 100, and
// its memory incomplete when one container's is.
func TestAPodsFiguresOnAGPUSumItsContainers(t *testing.T) {
	c := func(name string, mem uint64, complete bool, sm float64) Container {
		return Container{Ref: podpid.Ref{Namespace: "ml", Name: "p", Container: name}, MemoryBytes: mem, MemoryComplete: complete, SMPercent: sm, SMKnown: true}
	}
	snap := Snapshot{GPUs: []GPU{
		{UUID: "GPU-0", Index: 0, Containers: []Container{c("a", gib, true, 70), c("b", gib, true, 60)}},
		{UUID: "GPU-1", Index: 1, Containers: []Container{c("a", gib, true, 10), c("b", gib, false, 10)}},
	}}
	want := []Pod{{Namespace: "ml", Name: "p", GPUs: []PodGPU{
		{UUID: "GPU-0", Index: 0, MemoryBytes: 2 * gib, MemoryComplete: true, SMPercent: 100, SMKnown: true},
		{UUID: "GPU-1", Index: 1, MemoryBytes: 2 * gib, MemoryComplete: false, SMPercent: 20, SMKnown: true},
	}}}
	if got := snap.Pods(); !reflect.DeepEqual(got, want) {
		t.Errorf("pods:\n got %+v\nwant %+v", got, want)
	}
}
