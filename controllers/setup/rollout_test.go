package setup_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/wait"
)

// unapplied says whether a node has a spec entry of the policy that its agent has not reported applied:
// the test's own reading of "a change in flight", independent of the controller's index.
func unapplied(gn *v1.GPUNode, policy string) bool {
	for _, e := range gn.Spec.GPUs {
		if e.Policy != policy {
			continue
		}
		applied := false
		for _, g := range gn.Status.GPUs {
			if g.UUID == e.UUID && g.Applied != nil && g.Applied.SpecHash == v1.SharingHash(e.Sharing) {
				applied = true
			}
		}
		if !applied {
			return true
		}
	}
	return false
}

func TestDisruptiveRolloutNeverExceedsMaxUnavailable(t *testing.T) {
	rollout(t, 6, 0, intstr.FromInt32(1), 1)
}

// A percentage is of the GPU nodes selected: four CPU-only Nodes carry the label too, and counting them
// would double the budget to four.
func TestAPercentageBudgetCountsOnlyGPUNodes(t *testing.T) {
	rollout(t, 4, 4, intstr.FromString("50%"), 2)
}

// rollout rolls a MIG layout out to gpuNodes nodes, with cpuNodes more Nodes carrying the same label but
// no GPUNode, and checks through a watch that at most limit nodes have an unapplied change at any time.
func rollout(t *testing.T, gpuNodes, cpuNodes int, maxUnavailable intstr.IntOrString, limit int) {
	x := id(t)
	n := gpuNodes
	var nodes []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", x, i)
		nodes = append(nodes, name)
		// The agents report the GPUs Exclusive as found, so the MIG layout is a disruptive change.
		addNode(t, name, []v1.GPUStatus{b.GPU(name, 0, b.WithApplied(b.Exclusive(), "")), b.GPU(name, 1, b.WithApplied(b.Exclusive(), ""))}, "pool", x)
	}
	for i := range cpuNodes {
		name := fmt.Sprintf("%s-cpu-%d", x, i)
		if err := k8s.Create(context.Background(), b.Node(name, "pool", x)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), b.Node(name)) })
	}
	policy := x + "-mig"

	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := wc.Watch(ctx, &v1.GPUNodeList{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// The watcher sees every GPUNode state in the API server's order; simulated agents ack each node's
	// change 50ms after they see it.
	var (
		mu          sync.Mutex
		maxInFlight int
		sawWaiting  bool
		// watching turns false if the API server ends the watch (it does so to readers that fall
		// behind); the count would then be blind, so the test fails rather than passes.
		watching = true
	)
	latest := map[string]*v1.GPUNode{}
	scheduled := map[string]int64{}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		defer func() {
			mu.Lock()
			watching = false
			mu.Unlock()
		}()
		for ev := range w.ResultChan() {
			gn, ok := ev.Object.(*v1.GPUNode)
			if !ok || !strings.HasPrefix(gn.Name, x+"-") {
				continue
			}
			mu.Lock()
			if ev.Type == watch.Deleted {
				delete(latest, gn.Name)
			} else {
				latest[gn.Name] = gn
			}
			inFlight := 0
			for _, g := range latest {
				if unapplied(g, policy) {
					inFlight++
				}
			}
			maxInFlight = max(maxInFlight, inFlight)
			if unapplied(gn, policy) && scheduled[gn.Name] != gn.Generation {
				scheduled[gn.Name] = gn.Generation
				name := gn.Name
				time.AfterFunc(50*time.Millisecond, func() { _ = agentsim.Ack(ctx, k8s, name, nil) })
			}
			mu.Unlock()
		}
	}()

	addPolicy(t, b.Policy(policy, b.WithNodeLabels("pool", x), b.WithSharing(b.MIG("3g.40gb", 2)),
		b.WithMaxUnavailable(maxUnavailable)), nodes...)

	wait.For(t, 30*time.Second, func() error {
		mu.Lock()
		alive := watching
		mu.Unlock()
		if !alive {
			t.Fatal("the API server ended the watch before the rollout converged")
		}
		if !sawWaiting && conditionIs(policy, v1.ConditionProgressing, metav1.ConditionTrue, v1.ReasonWaitingForRollout, fmt.Sprintf("maxUnavailable %d", limit)) == nil {
			sawWaiting = true
		}
		return readyWith(policy, int32(n), int32(2*n))
	}, "every node converges")
	mu.Lock()
	stillWatching := watching
	mu.Unlock()
	if !stillWatching {
		t.Fatal("the API server ended the watch before the test finished watching")
	}
	cancel()
	<-watchDone
	mu.Lock()
	defer mu.Unlock()
	if maxInFlight > limit {
		t.Errorf("saw %d nodes with an unapplied disruptive change at once, maxUnavailable is %d", maxInFlight, limit)
	}
	if maxInFlight == 0 {
		t.Errorf("the watcher never saw a change in flight; it watched nothing")
	}
	if !sawWaiting {
		t.Errorf("the policy never reported Progressing=True/WaitingForRollout while nodes waited")
	}
	for _, name := range nodes {
		if err := specIs(name, map[int32]string{0: policy + "/MIG", 1: policy + "/MIG"}); err != nil {
			t.Error(err)
		}
	}
}
