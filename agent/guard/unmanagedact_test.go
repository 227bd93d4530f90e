package guard

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/prom"
)

func namedProc(pod string, pid int32) Process {
	return Process{PodRef: vacate.PodRef{Namespace: "default", Name: pod}, UID: types.UID("uid-" + pod), Container: "main", PID: pid}
}

// Under Evict a named pod is evicted once per pass at most, whatever its number of processes, again only
// after evictRetry while it stays named; under Report it never is; a pod that left is forgotten, so it is
// evicted at once if it comes back.
func TestTheEnforcerEvictsNamedPodsOnlyUnderEvictAndSpacesRetries(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	ev := &recordingEvictor{}
	e := &Enforcer{NodeName: "n", Evictor: ev, Clock: clk}
	verdict := Verdict{Kind: KindShim, Read: true, Named: []Process{namedProc("a", 1), namedProc("a", 2), namedProc("b", 3)}}
	pass := func(action v1alpha1.UnmanagedAction, v Verdict) []string {
		ev.mu.Lock()
		ev.pods = nil
		ev.mu.Unlock()
		e.Enforce(context.Background(), []GPU{{UUID: gpu0, Action: action, Verdict: v}})
		slices.Sort(ev.pods)
		return ev.pods
	}
	if got := pass(v1alpha1.UnmanagedReport, verdict); len(got) != 0 {
		t.Fatalf("Report evicted %v", got)
	}
	if got := pass(v1alpha1.UnmanagedEvict, verdict); !slices.Equal(got, []string{"default/a", "default/b"}) {
		t.Fatalf("Evict evicted %v, want a and b once each", got)
	}
	clk.SetTime(t0.Add(evictRetry / 2))
	if got := pass(v1alpha1.UnmanagedEvict, verdict); len(got) != 0 {
		t.Fatalf("evicted %v again within the retry interval", got)
	}
	clk.SetTime(t0.Add(evictRetry + time.Second))
	if got := pass(v1alpha1.UnmanagedEvict, verdict); !slices.Equal(got, []string{"default/a", "default/b"}) {
		t.Fatalf("after the retry interval evicted %v, want a and b again", got)
	}
	// An unread GPU keeps what it named: no new eviction, nothing forgotten.
	if got := pass(v1alpha1.UnmanagedEvict, Verdict{Kind: KindShim}); len(got) != 0 {
		t.Fatalf("an unread GPU evicted %v", got)
	}
	// b's process went; it comes back at once: a new breach, evicted without waiting.
	pass(v1alpha1.UnmanagedEvict, Verdict{Kind: KindShim, Read: true, Named: []Process{namedProc("a", 1)}})
	if got := pass(v1alpha1.UnmanagedEvict, verdict); !slices.Equal(got, []string{"default/b"}) {
		t.Fatalf("a pod named again evicted %v, want b alone (a waits for its retry)", got)
	}
}

// A pod's series counts its named processes on the GPU and goes when it has none; a GPU not read keeps
// its series.
func TestMetricsFollowTheNamedProcesses(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	series := func(pod string) (float64, bool) {
		return prom.Find(t, reg, "gpusharing_unmanaged_processes", map[string]string{"node": "n", "gpu": gpu0, "pod": pod})
	}
	m.Record("n", map[string]Verdict{gpu0: {Read: true, Named: []Process{namedProc("a", 1), namedProc("a", 2), namedProc("b", 3)}}})
	if v, ok := series("a"); !ok || v != 2 {
		t.Fatalf("a's series %v (present %v), want 2", v, ok)
	}
	m.Record("n", map[string]Verdict{gpu0: {Read: false}})
	if _, ok := series("a"); !ok {
		t.Fatal("a's series gone after a pass that did not read the GPU")
	}
	m.Record("n", map[string]Verdict{gpu0: {Read: true, Named: []Process{namedProc("b", 3)}}})
	if _, ok := series("a"); ok {
		t.Fatal("a's series outlived its processes")
	}
	if v, ok := series("b"); !ok || v != 1 {
		t.Fatalf("b's series %v (present %v), want 1", v, ok)
	}
}
