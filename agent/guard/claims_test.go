package guard

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/accounting"
	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// usageOf is GPU-0's account with the containers, each process holding an equal part of its memory.
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

// ctr is a container of pod in namespace ml holding memory through its processes pids.
func ctr(pod string, memory uint64, pids ...int32) accounting.Container {
	return accounting.Container{Ref: podpid.Ref{Namespace: "ml", Name: pod, Container: "c"}, PIDs: pids, MemoryBytes: memory, MemoryComplete: true}
}

// A ledger group is the pods of the GPU linked by the claims they share there: its processes together
// are judged against its claims together. A claim reserved for two pods bounds both together; a pod with
// two claims of the GPU gets their sum; claims chained through a pod make one group. A pod on the GPU
// with no claim of it has claimed nothing; a process of no pod is no pod's. NVML's figure equal to the
// claim (a process that filled its limit, claim less the context reserve, with a context of the reserve)
// is within.
func TestJudgeClaimsComparesEachLedgerGroupWithItsClaimsOnTheGPU(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "ml", Name: "a1", Pods: []string{"two-claims"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "a2", Pods: []string{"two-claims"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "b", Pods: []string{"b1", "b2"}, GPU: "GPU-0", MemoryBytes: 4 << 30},
		{Namespace: "ml", Name: "c", Pods: []string{"over"}, GPU: "GPU-0", MemoryBytes: 4 << 30},
		{Namespace: "ml", Name: "d", Pods: []string{"x", "y"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "e", Pods: []string{"y", "z"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "ml", Name: "full", Pods: []string{"full"}, GPU: "GPU-0", MemoryBytes: 8 << 30},
		{Namespace: "ml", Name: "elsewhere", Pods: []string{"no-claim"}, GPU: "GPU-1", MemoryBytes: 8 << 30},
	}
	acct := usageOf(
		ctr("two-claims", 3<<30, 1), ctr("two-claims", 1<<30, 2), // 4 GiB of 2+2: within
		ctr("b1", 3<<30, 3), ctr("b2", 2<<30, 4), // 5 GiB of the 4 they share
		ctr("over", 3<<30, 5), ctr("over", 2<<30, 6), // 5 GiB of 4
		ctr("x", 1<<30, 7), ctr("y", 1<<30, 8), ctr("z", 1<<30, 9), // 3 GiB of d+e
		ctr("full", (8<<30-768<<20)+768<<20, 10), // its limit filled, and a context of the reserve: 8 GiB
		ctr("no-claim", 1<<20, 11),
		ctr("", 8<<30, 12), // the MPS server, a host process
	)
	over, unknown := judgeClaims(claimKnowledge{claims: claims, whole: true}, acct, nil, nil)
	var got []string
	for _, o := range over {
		got = append(got, o.String())
	}
	want := []string{"ml/b1 and ml/b2 hold 5Gi, their claims 4Gi", "ml/no-claim holds 1Mi, its claims 0", "ml/over holds 5Gi, its claims 4Gi"}
	if !reflect.DeepEqual(got, want) || len(unknown) != 0 {
		t.Errorf("over their claims: %q, unknown %v; want %q, none", got, unknown, want)
	}
	acct = usageOf(ctr("full", 8<<30+1<<20, 10))
	if over, _ := judgeClaims(claimKnowledge{claims: claims, whole: true}, acct, nil, nil); len(over) != 1 {
		t.Errorf("a MiB past its 8Gi claim: over %v, want the pod", over)
	}
}

// A pod is judged only when every claim it uses is known: read from the API server after the pod was
// first seen on the GPU (the scheduler reserves a claim before it binds the pod), and none of them
// lacking its GPU or amounts. A group with a pod not known is not judged, and nothing is "claimed 0"
// for want of a read.
func TestJudgeClaimsLeavesPodsWhoseClaimsAreNotKnownUnjudged(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	claims := []dra.SizedClaim{
		{Namespace: "ml", Name: "shared", Pods: []string{"first"}, GPU: "GPU-0", MemoryBytes: 4 << 30},
		{Namespace: "ml", Name: "solo", Pods: []string{"solo"}, GPU: "GPU-0", MemoryBytes: 4 << 30},
	}
	acct := usageOf(ctr("first", 3<<30, 1), ctr("second", 3<<30, 2), ctr("solo", 5<<30, 3))
	acct.At = t0.Add(3 * time.Second)
	seen := map[vacate.PodRef]time.Time{{Namespace: "ml", Name: "first"}: t0, {Namespace: "ml", Name: "solo"}: t0,
		{Namespace: "ml", Name: "second"}: t0.Add(2 * time.Second)}
	judge := func(k claimKnowledge) string {
		over, unknown := judgeClaims(k, acct, nil, seen)
		return fmt.Sprintf("over %v unknown %v", over, unknown)
	}
	for _, tt := range []struct {
		name string
		k    claimKnowledge
		want string
	}{
		{"never read (a checkpoint moved aside, the API server away)", claimKnowledge{claims: claims},
			"over [] unknown [ml/first ml/second ml/solo]"},
		{"read before the second pod of the shared claim was seen: it is not known, nor is its group", claimKnowledge{claims: claims, syncedAt: t0.Add(time.Second)},
			"over [ml/solo holds 5Gi, its claims 4Gi] unknown [ml/second]"},
		{"read since, and the claim is not the second pod's: it claimed nothing here", claimKnowledge{claims: claims, syncedAt: t0.Add(2500 * time.Millisecond)},
			"over [ml/second holds 3Gi, its claims 0 ml/solo holds 5Gi, its claims 4Gi] unknown []"},
		{"a claim whose amounts are not known", claimKnowledge{claims: claims, syncedAt: t0.Add(time.Second), uncertain: map[vacate.PodRef]bool{{Namespace: "ml", Name: "solo"}: true}},
			"over [] unknown [ml/second ml/solo]"},
	} {
		if got := judge(tt.k); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
	// The read since shows the second pod in the shared claim's reservedFor: both together, 6 of 4.
	claims[0].Pods = []string{"first", "second"}
	if got, want := judge(claimKnowledge{claims: claims, syncedAt: t0.Add(2500 * time.Millisecond)}),
		"over [ml/first and ml/second hold 6Gi, their claims 4Gi ml/solo holds 5Gi, its claims 4Gi] unknown []"; got != want {
		t.Errorf("the shared claim read with both pods:\n got %s\nwant %s", got, want)
	}
}

// recordingEvictor records the pods it is asked to evict.
type recordingEvictor struct {
	mu   sync.Mutex
	pods []string
}

func (e *recordingEvictor) Evict(_ context.Context, p vacate.PodRef, _ types.UID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pods = append(e.pods, p.String())
	return nil
}

// A group over its claims under Evict evicts only the pods that alone hold more than the claims that list
// them; where none does, the excess comes from the sharing itself, no pod can be told apart, and every
// pod of the group goes. Claim c1 (8Gi) for pods a and b, c2 (8Gi) for a: a's own claims are 16Gi, b's 8Gi.
func TestTheClaimGuardEvictsOnlyThePodsOverTheirOwnClaims(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "ml", Name: "c1", Pods: []string{"a", "b"}, GPU: "GPU-0", MemoryBytes: 8 << 30},
		{Namespace: "ml", Name: "c2", Pods: []string{"a"}, GPU: "GPU-0", MemoryBytes: 8 << 30},
	}
	gpus := []v1alpha1.GPUStatus{{UUID: "GPU-0", Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS,
		Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, OnExceed: v1alpha1.ExceedEvict}}}}
	for _, tt := range []struct {
		name string
		a, b uint64
		want []string
	}{
		{"a past its own 16Gi, b within its 8Gi", 17 << 30, 1 << 30, []string{"ml/a"}},
		{"b past its own 8Gi, a within its 16Gi", 4 << 30, 13 << 30, []string{"ml/b"}},
		{"each within its own claims, the group over its 16Gi", 12 << 30, 6 << 30, []string{"ml/a", "ml/b"}},
		{"the group within its claims", 10 << 30, 6 << 30, nil},
	} {
		over, _ := judgeClaims(claimKnowledge{claims: claims, whole: true}, usageOf(ctr("a", tt.a, 1), ctr("b", tt.b, 2)), nil, nil)
		ev := &recordingEvictor{}
		cg := &Claims{Evictor: ev}
		cg.Guard(context.Background(), gpus, map[string][]OverClaim{"GPU-0": over})
		slices.Sort(ev.pods)
		if !slices.Equal(ev.pods, tt.want) {
			t.Errorf("%s: evicted %v, want %v", tt.name, ev.pods, tt.want)
		}
	}
}
