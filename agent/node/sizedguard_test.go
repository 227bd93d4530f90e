package node

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

type claimList []dra.SizedClaim

func (c claimList) SizedClaims() []dra.SizedClaim { return c }

// WithinClaims belongs to GPUs sized per claim: carried over from the status before, it leaves a GPU no
// longer sized, and every GPU of an agent without the kubelet plugin.
func TestWithinClaimsLeavesAGPUThatIsNoLongerSized(t *testing.T) {
	stale := metav1.Condition{Type: v1alpha1.ConditionWithinClaims, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonClaimExceeded}
	fixed := v1alpha1.GPUStatus{UUID: "GPU-0", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS}, Conditions: []metav1.Condition{stale}}
	for _, r := range []*Reconciler{{Claims: claimList{}}, {}} {
		gpus := []v1alpha1.GPUStatus{*fixed.DeepCopy()}
		r.setSizedClaims(&scope{}, gpus, nil)
		if c := meta.FindStatusCondition(gpus[0].Conditions, v1alpha1.ConditionWithinClaims); c != nil {
			t.Errorf("claims source %v: WithinClaims %+v kept on a GPU with fixed shares", r.Claims != nil, c)
		}
	}
}

type fixedUsage struct{ snap accounting.Snapshot }

func (u *fixedUsage) Latest() accounting.Snapshot { return u.snap }

// The kubelet unprepares a pod's claims once its containers stopped, while the accounting's latest read
// may still show its processes: the pod is judged again only on a read newer than its release, so a
// finished pod is neither reported nor evicted for memory it no longer holds; a read after the release
// that still shows its processes (they outlived their claims) does put it over.
func TestAPodWhoseClaimsWentIsJudgedOnlyOnAReadAfterThat(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC))
	sized := v1alpha1.GPUStatus{UUID: "GPU-0", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS,
		Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}}}
	read := func(at time.Time) accounting.Snapshot {
		g := usageOf(ctr("job", 500<<20, 0, 1))
		g.At = at
		return accounting.Snapshot{At: at, GPUs: []accounting.GPU{g}}
	}
	claims := claimList{{Namespace: "ml", Name: "job-gpu", Pods: []string{"job"}, GPU: "GPU-0", MemoryBytes: 1 << 30}}
	usage := &fixedUsage{snap: read(clk.Now())}
	r := &Reconciler{Claims: &claims, Usage: usage, Clock: clk}
	pass := func() (metav1.ConditionStatus, []guard.OverClaim) {
		t.Helper()
		sc := &scope{}
		gpus := []v1alpha1.GPUStatus{*sized.DeepCopy()}
		r.setSizedClaims(sc, gpus, nil)
		c := meta.FindStatusCondition(gpus[0].Conditions, v1alpha1.ConditionWithinClaims)
		if c == nil {
			t.Fatal("no WithinClaims condition on a GPU sized per claim")
		}
		return c.Status, sc.overClaims["GPU-0"]
	}
	if st, over := pass(); st != metav1.ConditionTrue || len(over) != 0 {
		t.Fatalf("within its claim: WithinClaims %s, over %v", st, over)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	claims = nil // the pod ended and the kubelet unprepared its claim; the latest read is from before
	if st, over := pass(); st != metav1.ConditionTrue || len(over) != 0 {
		t.Errorf("claim gone, read from before: WithinClaims %s, over %v; want True, none", st, over)
	}
	clk.SetTime(clk.Now().Add(2 * time.Second))
	usage.snap = read(clk.Now()) // a read after the release still shows its memory
	if st, over := pass(); st != metav1.ConditionFalse || len(over) != 1 {
		t.Errorf("claim gone, read after it still shows the pod: WithinClaims %s, over %v; want False, the pod", st, over)
	}
}
