package podpid

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The priority a pid gets is its pod's, as the API server's Priority admission resolved it from the
// pod's PriorityClass: nothing the process itself says enters it.
func TestPriorityIsThePodsResolvedPriorityClassValue(t *testing.T) {
	ctx := context.Background()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "podpid-gpu-high"}, Value: 1000}
	env.PriorityClass(t, ctx, pc)
	high := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "high", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "node-p", PriorityClassName: pc.Name,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if err := env.Client.Create(ctx, high); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, high, client.GracePeriodSeconds(0)) })
	plain := createPod(t, "plain", "node-p")

	root := t.TempDir()
	writeCgroup(t, root, 30, cgroupOf(high))
	writeCgroup(t, root, 31, cgroupOf(plain))
	writeCgroup(t, root, 32, "0::/system.slice/host.service\n")
	r := &Resolver{Reader: env.Client, NodeName: "node-p", ProcRoot: root}
	if p, ok := r.Priority(ctx, 30); !ok || p != 1000 {
		t.Errorf("pod with class %s: priority %d, %v; want 1000", pc.Name, p, ok)
	}
	if p, ok := r.Priority(ctx, 31); !ok || p != 0 {
		t.Errorf("pod without a class: priority %d, %v; want 0", p, ok)
	}
	if _, ok := r.Priority(ctx, 32); ok {
		t.Error("a host process was given a pod's priority")
	}
	if _, ok := r.Priority(ctx, 33); ok {
		t.Error("a pid without a /proc entry was given a priority")
	}
	// The accounting's per-container refs carry the same priority (it classes a GPU's consumers).
	refs := r.Refs(ctx, []int32{30, 31, 32})
	if refs[30].Priority != 1000 || refs[31].Priority != 0 || len(refs) != 2 {
		t.Errorf("refs %+v: want pid 30 at priority 1000, pid 31 at 0, and no host process", refs)
	}
}

// A new pod's process is looked up with a fresh list even within MinRelist (a miss would leave it at
// the lowest priority for the life of its connection), but not more often than priorityRelist.
func TestPriorityOfANewPodListsAgainSoon(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	first := createPod(t, "prio-first", "node-q")
	writeCgroup(t, root, 40, cgroupOf(first))
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC))
	r := &Resolver{Reader: env.Client, NodeName: "node-q", ProcRoot: root, MinRelist: time.Hour, Clock: clk}
	if _, ok := r.Priority(ctx, 40); !ok {
		t.Fatal("first pod not found")
	}
	second := createPod(t, "prio-second", "node-q")
	writeCgroup(t, root, 41, cgroupOf(second))
	if _, ok := r.Priority(ctx, 41); ok {
		t.Fatal("listed again at once: the relist bound does not hold")
	}
	clk.SetTime(clk.Now().Add(priorityRelist))
	if _, ok := r.Priority(ctx, 41); !ok {
		t.Fatal("a new pod was not found after priorityRelist, though MinRelist had not passed")
	}
}

// blockingReader holds its first List until release is closed, saying on entered when it got there.
type blockingReader struct {
	client.Reader
	entered, release chan struct{}
	once             bool
}

func (b *blockingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if !b.once {
		b.once = true
		close(b.entered)
		<-b.release
	}
	return b.Reader.List(ctx, list, opts...)
}

// A lookup waits for a list no longer than its own deadline, even while another caller's list is in flight
// and slow: the scheduler looks a client's pod up between HELLO and WELCOME, and a lookup held behind a
// slow list would make the shim's first connect time out.
func TestALookupBehindASlowListReturnsWithinItsDeadline(t *testing.T) {
	root := t.TempDir()
	pod := createPod(t, "slow-list", "node-s")
	writeCgroup(t, root, 50, cgroupOf(pod))
	b := &blockingReader{Reader: env.Client, entered: make(chan struct{}), release: make(chan struct{})}
	r := &Resolver{Reader: b, NodeName: "node-s", ProcRoot: root}
	slow := make(chan map[int32]string, 1)
	go func() { slow <- r.Names(context.Background(), []int32{50}) }()
	<-b.entered // the slow list is in flight

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	got := make(chan bool, 1)
	go func() { _, ok := r.Priority(ctx, 50); got <- ok }()
	select {
	case ok := <-got:
		if ok {
			t.Error("a priority came back before any list ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup waited past its deadline for another caller's list")
	}
	close(b.release)
	if names := <-slow; names[50] != "default/slow-list" {
		t.Errorf("the slow list's caller got %v, want pid 50 named default/slow-list", names)
	}
	// The list that ended serves the next lookup without another.
	if p, ok := r.Priority(context.Background(), 50); !ok || p != 0 {
		t.Errorf("after the list: priority %d, %v; want 0, true", p, ok)
	}
}
