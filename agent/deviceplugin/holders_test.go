package deviceplugin

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
)

// countingLister serves pods and counts its lists; err, when set, fails them.
type countingLister struct {
	mu    sync.Mutex
	pods  []*podresourcesv1.PodResources
	err   error
	lists int
}

func (l *countingLister) List(context.Context, *podresourcesv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lists++
	return &podresourcesv1.ListPodResourcesResponse{PodResources: l.pods}, l.err
}

func (l *countingLister) set(pods ...*podresourcesv1.PodResources) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = pods
}

func (l *countingLister) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lists
}

// A pod holds a GPU when a container of it was allocated the GPU or a replica of it, under any resource;
// one list answers for MaxAge, except that a "no" for a pod is believed only from a list begun after the
// pod was first asked about (the kubelet allocated its devices before its process could connect).
func TestPodHoldersAnswersFromTheKubeletsAllocations(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
	l := &countingLister{}
	l.set(fakekubelet.Pod("ml", "trainer", "gpusharing.io/gpu-shared", share.ReplicaID("GPU-a", 1)),
		fakekubelet.Pod("ml", "whole", "nvidia.com/gpu", "GPU-b"))
	h := &PodHolders{Lister: l, Clock: clk}
	ask := func(ns, name, gpu string, want bool, lists int) {
		t.Helper()
		got, err := h.Holds(ctx, ns, name, gpu)
		if err != nil || got != want || l.count() != lists {
			t.Fatalf("%s/%s on %s: %v, %v after %d lists; want %v after %d", ns, name, gpu, got, err, l.count(), want, lists)
		}
	}
	ask("ml", "trainer", "GPU-a", true, 1)
	ask("ml", "whole", "GPU-b", true, 1)    // the same list
	ask("ml", "trainer", "GPU-b", false, 1) // a "no" from a list begun when the pod was first asked
	// A pod first asked about after the list: its "no" needs a list of its own, which finds its allocation.
	clk.Step(100 * time.Millisecond)
	l.set(append(l.pods, fakekubelet.Pod("ml", "new", "gpusharing.io/gpu-shared", share.ReplicaID("GPU-a", 0)))...)
	ask("ml", "new", "GPU-a", true, 2)
	clk.Step(time.Millisecond)
	ask("ml", "stranger", "GPU-a", false, 3)
	ask("ml", "stranger", "GPU-a", false, 3) // asked again within MaxAge: believed
	clk.Step(DefaultHoldersMaxAge)
	ask("ml", "trainer", "GPU-a", true, 4) // past MaxAge: listed again

	l.mu.Lock()
	l.err = errors.New("kubelet restarting")
	l.mu.Unlock()
	clk.Step(DefaultHoldersMaxAge)
	if got, err := h.Holds(ctx, "ml", "trainer", "GPU-a"); err == nil {
		t.Fatalf("a failed list answered %v without an error: could not check is not a no", got)
	}
}

// blockingLister holds every list until release closes.
type blockingLister struct{ release chan struct{} }

func (b blockingLister) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest, _ ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return &podresourcesv1.ListPodResourcesResponse{}, nil
}

// A kubelet that does not answer costs a caller no more than its context: the question runs between a
// shim's HELLO and its WELCOME.
func TestPodHoldersWaitsNoLongerThanTheCallersContext(t *testing.T) {
	b := blockingLister{release: make(chan struct{})}
	defer close(b.release)
	h := &PodHolders{Lister: b}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := h.Holds(ctx, "ml", "trainer", "GPU-a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Holds with a silent kubelet: %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Holds returned after %v, past its 50ms context", d)
	}
}
