package app

import (
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
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
