package node

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const mib = 1 << 20

func usageOf(containers ...accounting.Container) accounting.GPU {
	g := accounting.GPU{UUID: "GPU-0", ProcessesRead: true, UtilizationRead: true}
	for _, c := range containers {
		for _, pid := range c.PIDs {
			g.Processes = append(g.Processes, accounting.Process{PID: pid, MemoryKnown: true, MemoryBytes: c.MemoryBytes / uint64(len(c.PIDs))})
		}
	}
	g.Containers = containers
	return g
}

func ctr(pod string, memory uint64, sm float64, pids ...int32) accounting.Container {
	return accounting.Container{Ref: podpid.Ref{Namespace: "ml", Name: pod, Container: "c"}, PIDs: pids,
		MemoryBytes: memory, MemoryComplete: true, SMPercent: sm, SMKnown: true}
}

func TestUsageStatusPublishesOnlyChangesPastTheThresholds(t *testing.T) {
	prev := usageStatus(usageOf(ctr("a", 4096*mib, 40, 1)), nil, nil)
	tests := []struct {
		name    string
		now     accounting.GPU
		changed bool
	}{
		{"the same sample", usageOf(ctr("a", 4096*mib, 40, 1)), false},
		{"memory drifts 100 MiB", usageOf(ctr("a", 4196*mib, 40, 1)), false},
		{"utilization drifts 9 points", usageOf(ctr("a", 4096*mib, 49, 1)), false},
		{"memory grows 300 MiB", usageOf(ctr("a", 4396*mib, 40, 1)), true},
		{"utilization moves 10 points", usageOf(ctr("a", 4096*mib, 30, 1)), true},
		{"a pod comes", usageOf(ctr("a", 4096*mib, 40, 1), ctr("b", 0, 0, 2)), true},
		{"the pod leaves", usageOf(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := usageStatus(tt.now, prev, nil)
			if changed := !equality.Semantic.DeepEqual(got, prev); changed != tt.changed {
				t.Errorf("changed = %v, want %v: %+v -> %+v", changed, tt.changed, prev, got)
			}
		})
	}
}

func TestUsageStatusListsAtMostMaxConsumersLargestFirst(t *testing.T) {
	var cs []accounting.Container
	for i := 0; i < v1alpha1.MaxConsumersInStatus+8; i++ {
		cs = append(cs, accounting.Container{Ref: podpid.Ref{Namespace: "ns", Name: fmt.Sprintf("pod-%02d", i)}, PIDs: []int32{int32(i + 1)},
			MemoryBytes: uint64(i+1) * 1024 * mib, MemoryComplete: true})
	}
	st := usageStatus(usageOf(cs...), nil, nil)
	if len(st.Consumers) != v1alpha1.MaxConsumersInStatus || st.OmittedConsumers != 8 || st.Processes != int32(len(cs)) {
		t.Fatalf("consumers %d omitted %d processes %d; want %d, 8, %d", len(st.Consumers), st.OmittedConsumers, st.Processes, v1alpha1.MaxConsumersInStatus, len(cs))
	}
	if st.Consumers[0].Pod != "pod-39" || st.Consumers[len(st.Consumers)-1].Pod != "pod-08" {
		t.Errorf("consumers run %s..%s, want pod-39..pod-08 (largest first)", st.Consumers[0].Pod, st.Consumers[len(st.Consumers)-1].Pod)
	}
	if want := resource.NewQuantity(int64(40*41/2)*1024*mib, resource.BinarySI); st.MemoryUsed.Cmp(*want) != 0 {
		t.Errorf("memoryUsed = %s, want every process's sum %s", st.MemoryUsed, want)
	}
}

func TestUsageSampleWakesAPassOnlyWhenTheStatusWouldChange(t *testing.T) {
	wakes := 0
	r := &Reconciler{Notify: func() { wakes++ }}
	g := usageOf(ctr("a", 4096*mib, 40, 1))
	r.usage.set([]v1alpha1.GPUStatus{{UUID: "GPU-0", Usage: usageStatus(g, nil, nil)}})
	r.UsageSampled(accounting.Snapshot{GPUs: []accounting.GPU{usageOf(ctr("a", 4100*mib, 45, 1))}})
	if wakes != 0 {
		t.Errorf("a sample within the thresholds woke %d passes", wakes)
	}
	r.UsageSampled(accounting.Snapshot{GPUs: []accounting.GPU{usageOf(ctr("a", 4096*mib, 40, 1), ctr("b", mib, 0, 2))}})
	if wakes != 1 {
		t.Errorf("a pod that came woke %d passes, want 1", wakes)
	}
}

func TestMemoryUsedSummaryShowsEachGPU(t *testing.T) {
	q := func(b int64) *resource.Quantity { return resource.NewQuantity(b, resource.BinarySI) }
	gpus := []v1alpha1.GPUStatus{
		{Index: 1, Memory: q(80 << 30), Usage: &v1alpha1.GPUUsage{MemoryUsed: q(0)}},
		{Index: 0, Memory: q(80 << 30), Usage: &v1alpha1.GPUUsage{MemoryUsed: q(12<<30 + 512*mib)}},
		{Index: 2, Memory: q(80 << 30)},
	}
	if got, want := memoryUsedSummary(gpus), "0:12.5Gi/80Gi 1:0/80Gi"; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}

// TestAgentPublishesEachGPUsConsumers runs the reconciler against the API server with the accounting
// over the mock GPUs: the status lists each GPU's containers and the wide column's summary.
func TestAgentPublishesEachGPUsConsumers(t *testing.T) {
	a := newAgent(t, withNVML)
	g0 := a.server.GPUs[0]
	g0.SetUsage(nvmlmock.Proc(100, 3<<30, 60), nvmlmock.Proc(200, 1<<30, 20))
	g0.AdvanceSamples(1_000_000)
	acct := &accounting.Accountant{GPUs: gpu.NewNVML(a.server), Pods: fixedPods{
		100: {Namespace: "ml", Name: "train", Container: "main"},
		200: {Namespace: "ml", Name: "serve", Container: "main"},
	}}
	a.r.Usage = acct
	acct.Sample(context.Background())
	n := a.pass(t)
	var st0, st1 v1alpha1.GPUStatus
	for _, g := range n.Status.GPUs {
		if g.UUID == g0.UUID {
			st0 = g
		} else {
			st1 = g
		}
	}
	u := st0.Usage
	if u == nil || len(u.Consumers) != 2 || u.Processes != 2 {
		t.Fatalf("GPU 0 usage = %+v, want two consumers", u)
	}
	if c := u.Consumers[0]; c.Pod != "train" || c.Memory.Value() != 3<<30 || c.SMUtilization == nil || *c.SMUtilization != 60 {
		t.Errorf("first consumer = %+v, want train with 3Gi at 60%%", c)
	}
	if st1.Usage == nil || len(st1.Usage.Consumers) != 0 {
		t.Errorf("GPU 1 usage = %+v, want none", st1.Usage)
	}
	if n.Status.MemoryUsed != "0:4Gi/40Gi 1:0/40Gi" {
		t.Errorf("memoryUsed = %q", n.Status.MemoryUsed)
	}

	// A drift within the thresholds writes nothing: the object's resourceVersion stays.
	g0.SetUsage(nvmlmock.Proc(100, 3<<30+50*mib, 63), nvmlmock.Proc(200, 1<<30, 20))
	g0.AdvanceSamples(1_000_000)
	acct.Sample(context.Background())
	if again := a.pass(t); again.ResourceVersion != n.ResourceVersion {
		t.Errorf("a drift within the thresholds wrote the status (resourceVersion %s -> %s)", n.ResourceVersion, again.ResourceVersion)
	}
	// The pod leaving is published.
	g0.SetUsage(nvmlmock.Proc(100, 3<<30, 60))
	acct.Sample(context.Background())
	if after := a.pass(t); len(after.Status.GPUs[0].Usage.Consumers)+len(after.Status.GPUs[1].Usage.Consumers) != 1 {
		t.Errorf("after a pod left: %+v / %+v", after.Status.GPUs[0].Usage, after.Status.GPUs[1].Usage)
	}
}

type fixedPods map[int32]podpid.Ref

func (p fixedPods) Refs(_ context.Context, pids []int32) map[int32]podpid.Ref {
	out := map[int32]podpid.Ref{}
	for _, pid := range pids {
		if r, ok := p[pid]; ok {
			out[pid] = r
		}
	}
	return out
}

func TestConsumersAreClassedByTheirPodsPriorityUnderProductionClasses(t *testing.T) {
	serve, batch := ctr("serve", 4096*mib, 30, 1), ctr("batch", 8192*mib, 60, 2)
	serve.Priority, batch.Priority = 1000, 10
	g := usageOf(serve, batch)
	class := func(st *v1alpha1.GPUUsage) map[string]v1alpha1.WorkloadClass {
		out := map[string]v1alpha1.WorkloadClass{}
		for _, c := range st.Consumers {
			out[c.Pod] = c.Class
		}
		return out
	}
	if got := class(usageStatus(g, nil, nil)); got["serve"] != "" || got["batch"] != "" {
		t.Errorf("without qos: classes %v, want none", got)
	}
	qos := &v1alpha1.QoS{ProductionPriority: 1000}
	got := class(usageStatus(g, nil, qos))
	if got["serve"] != v1alpha1.ClassProduction || got["batch"] != v1alpha1.ClassOpportunistic {
		t.Errorf("productionPriority 1000: classes %v, want serve Production (priority 1000), batch Opportunistic (10)", got)
	}
	// A changed threshold reclasses at once: the published usage is compared with its classes.
	qos.ProductionPriority = 1001
	if got := class(usageStatus(g, nil, qos)); got["serve"] != v1alpha1.ClassOpportunistic {
		t.Errorf("productionPriority 1001: serve is %s, want Opportunistic", got["serve"])
	}
}
