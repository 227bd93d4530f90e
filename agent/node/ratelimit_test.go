package node

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Through an API server outage every pass fails; once it is back, the next pass (which publishes what the
// agent saw meanwhile) must come within the resync, not after controller-runtime's default backoff of up
// to 1000 s.
func TestFailedPassesAreRetriedNoLaterThanTheResync(t *testing.T) {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "node-a"}}
	for _, tc := range []struct {
		resync, want time.Duration
	}{{2 * time.Second, 2 * time.Second}, {0, 30 * time.Second}} {
		rl := (&Reconciler{Resync: tc.resync}).rateLimiter()
		if first := rl.When(req); first > 10*time.Millisecond {
			t.Errorf("resync %s: first retry after %s, want the usual quick one", tc.resync, first)
		}
		var last time.Duration
		for range 30 { // 30 failures: a 30 s outage at the default backoff's pace, and more
			last = rl.When(req)
		}
		if last != tc.want {
			t.Errorf("resync %s: retry after 31 failures waits %s, want %s", tc.resync, last, tc.want)
		}
	}
}
