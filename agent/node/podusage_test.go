package node

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// gpuOf is GPU index i ("GPU-i") with the containers; podCtr is container c of pod ns/pod.
func gpuOf(i int, cs ...accounting.Container) accounting.GPU {
	g := usageOf(cs...)
	g.UUID, g.Index = fmt.Sprintf("GPU-%d", i), i
	return g
}

func podCtr(pod, c string, memory uint64, sm float64) accounting.Container {
	return accounting.Container{Ref: podpid.Ref{Namespace: "ml", Name: pod, Container: c}, PIDs: []int32{1},
		MemoryBytes: memory, MemoryComplete: true, SMPercent: sm, SMKnown: true}
}

func snapshotOf(gpus ...accounting.GPU) accounting.Snapshot {
	return accounting.Snapshot{At: time.Unix(1e9, 0), GPUs: gpus}
}

// names renders status.pods as "ns/name:idx,idx" for comparing order and GPUs.
func names(ps []v1alpha1.PodGPUs) []string {
	var out []string
	for _, p := range ps {
		s := p.Namespace + "/" + p.Name + ":"
		for i, g := range p.GPUs {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprint(g.Index)
		}
		out = append(out, s)
	}
	return out
}

func TestPodsStatusListsAPodOnTwoGPUsOnceWithBoth(t *testing.T) {
	snap := snapshotOf(
		gpuOf(0, podCtr("tp", "rank0", 3072*mib, 40)),
		gpuOf(1, podCtr("tp", "rank0", 512*mib, 5), podCtr("tp", "rank1", 1024*mib, 50), podCtr("one", "c", mib, 1)),
	)
	pods, omitted := podsStatus(snap, nil)
	if got := names(pods); len(got) != 1 || got[0] != "ml/tp:0,1" || omitted != 0 {
		t.Fatalf("pods = %v, omitted %d; want only ml/tp on GPUs 0 and 1 (a pod on one GPU is not listed)", got, omitted)
	}
	g1 := pods[0].GPUs[1]
	if g1.UUID != "GPU-1" || g1.MemoryUsed.Value() != 1536*mib || g1.SMUtilization == nil || *g1.SMUtilization != 55 {
		t.Errorf("tp on GPU 1 = %+v, want its two containers summed: 1536Mi at 55%%", g1)
	}
}

func TestPodsStatusIsBoundedAndOrderedByGPUsThenName(t *testing.T) {
	var g0, g1, g2 []accounting.Container
	for i := range v1alpha1.MaxPodsInStatus + 8 {
		c := podCtr(fmt.Sprintf("pod-%02d", i), "c", mib, 0)
		g0, g1 = append(g0, c), append(g1, c)
	}
	wide := podCtr("zz-wide", "c", mib, 0)
	g0, g1, g2 = append(g0, wide), append(g1, wide), append(g2, wide)
	pods, omitted := podsStatus(snapshotOf(gpuOf(0, g0...), gpuOf(1, g1...), gpuOf(2, g2...)), nil)
	got := names(pods)
	if len(got) != v1alpha1.MaxPodsInStatus || omitted != 9 {
		t.Fatalf("%d pods listed, %d omitted; want %d and 9", len(got), omitted, v1alpha1.MaxPodsInStatus)
	}
	if got[0] != "ml/zz-wide:0,1,2" || got[1] != "ml/pod-00:0,1" || got[len(got)-1] != "ml/pod-30:0,1" {
		t.Errorf("pods run %s, %s .. %s; want the three-GPU pod first, then pod-00 .. pod-30", got[0], got[1], got[len(got)-1])
	}
	// The same snapshot in another container order gives the same status.
	again, _ := podsStatus(snapshotOf(gpuOf(2, g2...), gpuOf(1, g1...), gpuOf(0, g0...)), nil)
	if !equality.Semantic.DeepEqual(again, pods) {
		t.Errorf("the GPUs in another order changed the status")
	}
}

func TestPodsStatusPublishesOnlyChangesPastTheThresholds(t *testing.T) {
	at := func(m0, m1 uint64, sm float64) accounting.Snapshot {
		return snapshotOf(gpuOf(0, podCtr("tp", "c", m0, sm)), gpuOf(1, podCtr("tp", "c", m1, sm)))
	}
	prev, _ := podsStatus(at(4096*mib, 4096*mib, 40), nil)
	tests := []struct {
		name    string
		now     accounting.Snapshot
		changed bool
	}{
		{"the same sample", at(4096*mib, 4096*mib, 40), false},
		{"memory drifts 100 MiB", at(4196*mib, 4096*mib, 40), false},
		{"utilization drifts 9 points", at(4096*mib, 4096*mib, 49), false},
		{"memory grows 300 MiB on one GPU", at(4096*mib, 4396*mib, 40), true},
		{"the pod leaves one GPU", snapshotOf(gpuOf(0, podCtr("tp", "c", 4096*mib, 40)), gpuOf(1)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := podsStatus(tt.now, prev)
			if changed := !equality.Semantic.DeepEqual(got, prev); changed != tt.changed {
				t.Errorf("changed = %v, want %v: %v -> %v", changed, tt.changed, prev, got)
			}
		})
	}
}

// A GPU the accounting could not read this time keeps what was published of it: the pod stays listed
// with both GPUs rather than vanishing for a failed read.
func TestPodsStatusKeepsAnUnreadGPUsEntries(t *testing.T) {
	prev, _ := podsStatus(snapshotOf(gpuOf(0, podCtr("tp", "c", 1024*mib, 0)), gpuOf(1, podCtr("tp", "c", 2048*mib, 0))), nil)
	failed := gpuOf(1)
	failed.Err = errors.New("GPU is lost")
	got, _ := podsStatus(snapshotOf(gpuOf(0, podCtr("tp", "c", 1024*mib, 0)), failed), prev)
	if !equality.Semantic.DeepEqual(got, prev) {
		t.Errorf("after a failed read of GPU 1: %v, want %v", names(got), names(prev))
	}
}

// The sum over a pod's containers can move past the threshold while each container's figure stays
// within it: that sample wakes a pass, since only status.pods shows it.
func TestUsageSampleWakesAPassWhenOnlyAPodsSumMoves(t *testing.T) {
	wakes := 0
	r := &Reconciler{Notify: func() { wakes++ }}
	// The large pod beside tp keeps GPU 0's total within its (relative) threshold too.
	big := podCtr("big", "c", 40960*mib, 0)
	before := snapshotOf(gpuOf(0, podCtr("tp", "a", 1024*mib, 0), podCtr("tp", "b", 1024*mib, 0), big), gpuOf(1, podCtr("tp", "a", 1024*mib, 0)))
	r.Usage = fixedSnapshot{before}
	st := &v1alpha1.GPUNodeStatus{}
	for _, g := range before.GPUs {
		st.GPUs = append(st.GPUs, v1alpha1.GPUStatus{UUID: g.UUID, Usage: usageStatus(g, nil, nil)})
	}
	r.setPods(st)
	r.usage.set(st.GPUs)
	after := snapshotOf(gpuOf(0, podCtr("tp", "a", 1224*mib, 0), podCtr("tp", "b", 1224*mib, 0), big), gpuOf(1, podCtr("tp", "a", 1024*mib, 0)))
	if !equality.Semantic.DeepEqual(usageStatus(after.GPUs[0], st.GPUs[0].Usage, nil), st.GPUs[0].Usage) {
		t.Fatal("the containers' figures moved past their threshold; the case needs them within it")
	}
	r.UsageSampled(after)
	if wakes != 1 {
		t.Errorf("tp's sum moved 400 MiB on GPU 0 (each container 200): %d passes woken, want 1", wakes)
	}
}

type fixedSnapshot struct{ accounting.Snapshot }

func (f fixedSnapshot) Latest() accounting.Snapshot { return f.Snapshot }

// TestAgentPublishesAPodOnTwoGPUsOnce runs the reconciler against the API server with the accounting
// over the mock GPUs: a pod whose processes use both GPUs is listed once in status.pods with both, and
// leaves the list when it leaves a GPU.
func TestAgentPublishesAPodOnTwoGPUsOnce(t *testing.T) {
	a := newAgent(t, withNVML)
	g0, g1 := a.server.GPUs[0], a.server.GPUs[1]
	g0.SetUsage(nvmlmock.Proc(100, 3<<30, 0))
	g1.SetUsage(nvmlmock.Proc(101, 1<<30, 0), nvmlmock.Proc(200, 1<<30, 0))
	acct := &accounting.Accountant{GPUs: gpu.NewNVML(a.server), Pods: fixedPods{
		100: {Namespace: "ml", Name: "tp", Container: "rank0"},
		101: {Namespace: "ml", Name: "tp", Container: "rank1"},
		200: {Namespace: "ml", Name: "serve", Container: "main"},
	}}
	a.r.Usage = acct
	acct.Sample(context.Background())
	n := a.pass(t)
	if got := names(n.Status.Pods); len(got) != 1 || got[0] != "ml/tp:0,1" {
		t.Fatalf("status.pods = %v, want ml/tp on GPUs 0 and 1", got)
	}
	p := n.Status.Pods[0]
	if p.GPUs[0].UUID != g0.UUID || p.GPUs[0].MemoryUsed.Value() != 3<<30 || p.GPUs[1].UUID != g1.UUID || p.GPUs[1].MemoryUsed.Value() != 1<<30 {
		t.Errorf("tp's GPUs = %+v, want %s with 3Gi and %s with 1Gi", p.GPUs, g0.UUID, g1.UUID)
	}

	g1.SetUsage(nvmlmock.Proc(200, 1<<30, 0))
	acct.Sample(context.Background())
	if after := a.pass(t); len(after.Status.Pods) != 0 {
		t.Errorf("after tp left GPU 1: status.pods = %v, want none", names(after.Status.Pods))
	}
}
