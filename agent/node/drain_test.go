package node

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/vacate"

	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestDrainSettingsDefaultToWaitForIdleForTenMinutes(t *testing.T) {
	zero := metav1.Duration{}
	tests := []struct {
		name    string
		in      *v1alpha1.Drain
		mode    v1alpha1.DrainMode
		timeout time.Duration
	}{
		{"omitted", nil, v1alpha1.DrainWaitForIdle, 10 * time.Minute},
		{"mode only", &v1alpha1.Drain{Mode: v1alpha1.DrainEvict}, v1alpha1.DrainEvict, 10 * time.Minute},
		{"explicit zero timeout looks once", &v1alpha1.Drain{Timeout: &zero}, v1alpha1.DrainWaitForIdle, 0},
		{"both", &v1alpha1.Drain{Mode: v1alpha1.DrainEvict, Timeout: &metav1.Duration{Duration: time.Minute}}, v1alpha1.DrainEvict, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if mode, timeout := drainSettings(tt.in); mode != tt.mode || timeout != tt.timeout {
				t.Errorf("drainSettings = %s %v, want %s %v", mode, timeout, tt.mode, tt.timeout)
			}
		})
	}
}

func TestDrainKeyChangesWithTheSharingAndTheDrainSettings(t *testing.T) {
	base := v1alpha1.GPUDesired{UUID: "GPU-a", Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive}}
	evict := base
	evict.Drain = &v1alpha1.Drain{Mode: v1alpha1.DrainEvict}
	other := base
	other.Sharing = v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2}}
	relabelled := base
	relabelled.Policy, relabelled.PolicyGeneration = "p", 7
	if drainKey(base) == drainKey(evict) || drainKey(base) == drainKey(other) {
		t.Error("a new drain mode or sharing kept the drain key: a failed drain would not be retried on that spec change")
	}
	if drainKey(base) != drainKey(relabelled) {
		t.Error("a new policy generation with the same sharing changed the drain key: it would restart a running drain")
	}
}

func TestDrainingMessageNamesThePodsAndWhatBlocksThem(t *testing.T) {
	tests := []struct {
		name string
		v    drainView
		want []string
	}{
		{"before the first list", drainView{target: "MIG 3g.20gb x1", mode: v1alpha1.DrainWaitForIdle, timeout: time.Minute},
			[]string{"GPU cordoned for MIG 3g.20gb x1 (WaitForIdle, timeout 1m0s)", "looking for the pods"}},
		{"waiting", drainView{target: "MPS x4", mode: v1alpha1.DrainWaitForIdle, timeout: time.Minute, listed: true, pods: []string{"a/x", "b/y"}},
			[]string{"waiting for 2 pods to end: a/x, b/y"}},
		{"evicting behind a budget", drainView{target: "MPS x4", mode: v1alpha1.DrainEvict, timeout: time.Minute, listed: true, pods: []string{"a/x"},
			message: "eviction of a/x blocked, retrying: Cannot evict pod as it would violate the pod's disruption budget."},
			[]string{"evicting 1 pods: a/x", "disruption budget"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, ok := outcome.As(drainingError(tt.v))
			if !ok || o.Reason != v1alpha1.ReasonDraining {
				t.Fatalf("drainingError = %v, want reason Draining", o)
			}
			for _, w := range tt.want {
				if !strings.Contains(o.Message, w) {
					t.Errorf("message %q lacks %q", o.Message, w)
				}
			}
		})
	}
}

func TestFailedDrainsBackOffDoublingUpToTheCap(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	s := drainState{phase: phaseDraining, seq: 1}
	var got []time.Duration
	for range 5 {
		s.phase = phaseDraining
		s, _ = next(s, observation{kind: obsDrainEnded, now: now, seq: 1, err: vacate.ErrTimeout, backoff: time.Minute, backoffMax: 5 * time.Minute})
		got = append(got, s.retryAt.Sub(now))
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", got, want)
		}
	}
	if failedPhase(s.failure) != v1alpha1.DrainPhaseTimedOut || failedPhase(outcome.Newf(v1alpha1.ReasonGPUBusy, "x")) != v1alpha1.DrainPhaseFailed {
		t.Error("failedPhase does not tell a timeout from another failure")
	}
}

func TestRequeueComesBeforeTheResyncWhenABackoffEndsFirst(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	r := &Reconciler{Resync: 30 * time.Second, Clock: clocktesting.NewFakePassiveClock(now)}
	if got := r.requeueAfter(); got != 30*time.Second {
		t.Errorf("no backoff: requeue after %v, want the resync", got)
	}
	r.drains.states = map[string]drainState{"GPU-a": {phase: phaseBackoff, retryAt: now.Add(10 * time.Second)}, "GPU-b": {phase: phaseFailed, retryAt: now.Add(20 * time.Second)}}
	if got := r.requeueAfter(); got != 10*time.Second {
		t.Errorf("backoff ending in 10s: requeue after %v", got)
	}
	r.drains.states["GPU-a"] = drainState{phase: phaseBackoff, retryAt: now.Add(time.Hour)}
	r.drains.states["GPU-b"] = drainState{phase: phaseBackoff, retryAt: now.Add(time.Hour)}
	if got := r.requeueAfter(); got != 30*time.Second {
		t.Errorf("backoff ending after the resync: requeue after %v, want the resync", got)
	}
}

// A restarted agent runs no shim scheduler yet; the status the agent before it published says whether
// the shim was in force, which makes starting it again a resume rather than a disruptive change (the
// real-node e2e's agent upgrade drained every shim GPU with a pod before this).
func TestPublishedShimMakesARestartedSchedulerAResume(t *testing.T) {
	shimOn := &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive, Shim: &v1alpha1.ShimStatus{}}
	node := &v1alpha1.GPUNode{Status: v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{
		{UUID: "GPU-a", Applied: shimOn},
		{UUID: "GPU-b", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive}},
	}}}
	for _, tt := range []struct {
		uuid     string
		strategy v1alpha1.Strategy
		want     bool
	}{
		{"GPU-a", v1alpha1.StrategyExclusive, true},
		{"GPU-a", v1alpha1.StrategyTimeSlicing, false}, // published under another strategy: not this shape
		{"GPU-b", v1alpha1.StrategyExclusive, false},   // the shim was never on: turning it on drains
		{"GPU-c", v1alpha1.StrategyExclusive, false},   // not published yet
	} {
		if got := publishedShim(node, tt.uuid, tt.strategy); got != tt.want {
			t.Errorf("publishedShim(%s, %s) = %v, want %v", tt.uuid, tt.strategy, got, tt.want)
		}
	}
	if publishedShim(nil, "GPU-a", v1alpha1.StrategyExclusive) {
		t.Error("no GPUNode yet: nothing was published")
	}
}

// Sizing is no hardware state, so the drain takes what is in force from the published status: turning
// per-claim sizing on or off empties the GPU, a sized GPU staying sized does not.
func TestPublishedSizingDecidesWhetherSizingChangesDisrupt(t *testing.T) {
	step := resource.MustParse("1Gi")
	node := &v1alpha1.GPUNode{Status: v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{
		{UUID: "GPU-a", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &step}}},
		{UUID: "GPU-b", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS}},
	}}}
	if !publishedSizing(node, "GPU-a").PerClaim() {
		t.Error("GPU-a publishes sized shares")
	}
	for _, uuid := range []string{"GPU-b", "GPU-c"} {
		if publishedSizing(node, uuid).PerClaim() {
			t.Errorf("%s publishes no sized shares", uuid)
		}
	}
	if publishedSizing(nil, "GPU-a") != nil {
		t.Error("no GPUNode yet: nothing was published")
	}
}
