package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// A ledger is the claim guard's group: a pod's claims on the GPU, and every pod and claim chained to them.
// Claim c1 for pods a and b plus claim c2 for a is one 16Gi ledger for both, not 16Gi for a and 8Gi for b
// (24Gi between them against the 16Gi the guard judges them by).
func TestLedgerOfAPodIsItsGuardGroupsClaimsOnTheGPU(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "a", Name: "c1", Pods: []string{"a", "b"}, GPU: "GPU-0", MemoryBytes: 8 << 30},
		{Namespace: "a", Name: "c2", Pods: []string{"a"}, GPU: "GPU-0", MemoryBytes: 8 << 30},
		{Namespace: "a", Name: "solo", Pods: []string{"s"}, GPU: "GPU-0", MemoryBytes: 1 << 30},
		{Namespace: "a", Name: "x", Pods: []string{"x", "y"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "a", Name: "y", Pods: []string{"y", "z"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
		{Namespace: "a", Name: "compute", Pods: []string{"k"}, GPU: "GPU-0"},
		{Namespace: "b", Name: "c1", Pods: []string{"a"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
	}
	chained := scheduler.Claim{Key: "a/c1,a/c2", Memory: 16 << 30}
	for _, c := range []struct {
		ns, pod string
		want    scheduler.Claim
		ok      bool
	}{
		{"a", "a", chained, true},
		{"a", "b", chained, true},
		{"a", "s", scheduler.Claim{Key: "a/solo", Memory: 1 << 30}, true},
		{"a", "x", scheduler.Claim{Key: "a/x,a/y", Memory: 4 << 30}, true},
		{"a", "z", scheduler.Claim{Key: "a/x,a/y", Memory: 4 << 30}, true},
		{"a", "k", scheduler.Claim{}, false}, // a claim without memory bounds nothing
		{"b", "a", scheduler.Claim{Key: "b/c1", Memory: 2 << 30}, true},
		{"b", "b", scheduler.Claim{}, false},
	} {
		got, ok := ledgerOf(claims, c.ns, c.pod)
		if got != c.want || ok != c.ok {
			t.Errorf("ledgerOf(%s/%s) = %+v, %v; want %+v, %v", c.ns, c.pod, got, ok, c.want, c.ok)
		}
	}
}

// sizedClaims is a fixed list of sized claims (node.SizedClaimSource).
type sizedClaims []dra.SizedClaim

func (s sizedClaims) SizedClaims() []dra.SizedClaim { return s }

// namedPods is the API server's answer to pod lookups: pid to pod, nil while it is away.
type namedPods map[int32]podpid.Ref

func (n namedPods) Refs(_ context.Context, pids []int32) map[int32]podpid.Ref {
	out := map[int32]podpid.Ref{}
	for _, pid := range pids {
		if r, ok := n[pid]; ok {
			out[pid] = r
		}
	}
	return out
}

// A process's ledger is found through the pod UIDs the claims record, without the API server; where a
// claim on the GPU has pods recorded without UIDs (a checkpoint from before they were kept), the pod is
// named through the API server as it must be, and a lookup that fails gives no ledger.
func TestTheLedgerIsFoundByPodUIDAndByNameOnlyForClaimsWithoutUIDs(t *testing.T) {
	uidA, uidB := "0000000a-0000-0000-0000-000000000001", "0000000b-0000-0000-0000-000000000002"
	procRoot := t.TempDir()
	for pid, uid := range map[int32]string{1: uidA, 2: uidB} {
		dir := filepath.Join(procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The systemd driver's spelling: the UID's dashes are '_'.
		cg := fmt.Sprintf("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%064x.scope\n", strings.ReplaceAll(uid, "-", "_"), pid)
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	withUIDs := sizedClaims{
		{Namespace: "a", Name: "c1", Pods: []string{"a", "b"}, PodUIDs: []types.UID{types.UID(uidA), types.UID(uidB)}, GPU: "GPU-0", MemoryBytes: 8 << 30},
		{Namespace: "a", Name: "c2", Pods: []string{"b"}, PodUIDs: []types.UID{types.UID(uidB)}, GPU: "GPU-0", MemoryBytes: 4 << 30},
	}
	oldRecord := sizedClaims{withUIDs[0], {Namespace: "a", Name: "c2", Pods: []string{"b"}, GPU: "GPU-0", MemoryBytes: 4 << 30}}
	named := namedPods{1: {Namespace: "a", Name: "a"}, 2: {Namespace: "a", Name: "b"}}
	group := scheduler.Claim{Key: "a/c1,a/c2", Memory: 12 << 30}
	for _, c := range []struct {
		name   string
		claims sizedClaims
		pods   namedPods
		pid    int32
		want   scheduler.Claim
		ok     bool
	}{
		{"UIDs recorded, API away", withUIDs, nil, 1, group, true},
		{"UIDs recorded, API away, the other pod", withUIDs, nil, 2, group, true},
		{"a claim without UIDs, API away", oldRecord, nil, 1, scheduler.Claim{}, false},
		{"a claim without UIDs, API answers", oldRecord, named, 1, group, true},
		{"a process that is gone", withUIDs, named, 3, scheduler.Claim{}, false},
	} {
		got, ok := claimLedgers(c.claims, procRoot, c.pods)("GPU-0", c.pid)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: ledger of pid %d = %+v, %v; want %+v, %v", c.name, c.pid, got, ok, c.want, c.ok)
		}
	}
}
