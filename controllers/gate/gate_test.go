package gate

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/gpusharing/gpusharing/test/wait"
)

func TestLateWritesShrinkTheLimitOncePerRoundTripDownToMin(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	g := New(Options{Min: 2, Max: 8, Target: 50 * time.Millisecond, Clock: clk})
	g.limit = 8
	g.Observe(200 * time.Millisecond)
	if got := g.Limit(); got != 6 {
		t.Fatalf("limit after a late write = %d, want 6 (8 x 0.75)", got)
	}
	// The writes in flight with the first late one are late for the same reason: no further decrease
	// until a round trip (the late write's latency) has passed.
	for range 5 {
		g.Observe(200 * time.Millisecond)
	}
	if got := g.Limit(); got != 6 {
		t.Fatalf("limit after late writes within one round trip = %d, want 6", got)
	}
	for range 10 {
		clk.SetTime(clk.Now().Add(200 * time.Millisecond))
		g.Observe(200 * time.Millisecond)
	}
	if got := g.Limit(); got != 2 {
		t.Fatalf("limit after many late round trips = %d, want Min 2", got)
	}
}

func TestFastWritesGrowAFullGateByAboutOneSlotPerRoundTripUpToMax(t *testing.T) {
	g := New(Options{Min: 2, Max: 4, Target: 50 * time.Millisecond})
	// Fast writes with slots to spare say nothing about more concurrency.
	g.Acquire()
	for range 10 {
		g.Observe(time.Millisecond)
	}
	if got := g.Limit(); got != 2 {
		t.Fatalf("limit after fast writes from a gate not full = %d, want 2", got)
	}
	g.Acquire()                 // now full: 2 of 2
	g.Observe(time.Millisecond) // 2.5
	g.Observe(time.Millisecond) // 2.9
	if got := g.Limit(); got != 2 {
		t.Fatalf("limit after two fast writes = %d, want 2 (+1/limit each)", got)
	}
	g.Observe(time.Millisecond) // 3.24
	if got := g.Limit(); got != 3 {
		t.Fatalf("limit after three fast writes = %d, want 3", got)
	}
	g.Acquire() // 3 of 3
	for range 100 {
		g.Observe(time.Millisecond)
	}
	if got := g.Limit(); got != 4 {
		t.Fatalf("limit after many fast writes = %d, want Max 4", got)
	}
}

func TestAcquireWaitsForAFreeSlotAndCloseReleasesWaiters(t *testing.T) {
	g := New(Options{Min: 1, Max: 1, Target: time.Second})
	if !g.Acquire() {
		t.Fatal("first Acquire failed")
	}
	got := make(chan bool, 1)
	go func() { got <- g.Acquire() }()
	// The second Acquire found the only slot taken and waits.
	wait.Until(t, 10*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waiting == 1
	}, "a second Acquire waits")
	select {
	case <-got:
		t.Fatal("a second Acquire got a slot while the only one was taken")
	default:
	}
	g.Release()
	if ok := <-got; !ok {
		t.Fatal("Acquire after Release failed")
	}
	go func() { got <- g.Acquire() }()
	g.Close()
	if ok := <-got; ok {
		t.Fatal("Acquire on a closed gate succeeded")
	}
}

// TestTheGatedQueueRunsAtMostLimitItemsAtOnce drives the queue as controller-runtime's workers do (Get,
// work, Done) with more workers than the gate's limit.
func TestTheGatedQueueRunsAtMostLimitItemsAtOnce(t *testing.T) {
	g := New(Options{Min: 2, Max: 2, Target: time.Second})
	q := NewQueue(g)("test", nil)
	for i := range 40 {
		q.Add(request(i))
	}
	var running, peak, done atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				item, shutdown := q.Get()
				if shutdown {
					return
				}
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				// The first item is held until a second one runs beside it, so the limit is reached
				// however the workers are scheduled; the others take a moment, room for a third to slip in.
				if done.Load() == 0 && n == 1 {
					err := wait.Poll(10*time.Second, func() error {
						if peak.Load() < 2 {
							return errors.New("one item runs")
						}
						return nil
					})
					if err != nil { // a worker's goroutine: no t.Fatal
						t.Errorf("no second item ran beside the first: %v", err)
					}
				}
				time.Sleep(2 * time.Millisecond)
				running.Add(-1)
				q.Done(item)
				if done.Add(1) == 40 {
					q.ShutDown()
				}
			}
		}()
	}
	wg.Wait()
	if got := peak.Load(); got != 2 {
		t.Errorf("at most %d items were processed at once, want the gate's limit 2", got)
	}
	if got := done.Load(); got != 40 {
		t.Errorf("%d items processed, want 40", got)
	}
}

func request(i int) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Name: fmt.Sprintf("n%d", i)}}
}
