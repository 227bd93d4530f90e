package app

import (
	"testing"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/scheduler"
)

func TestLedgerOfAPodIsItsClaimsOnTheGPUAndSharedClaimsAreOneLedger(t *testing.T) {
	claims := []dra.SizedClaim{
		{Namespace: "a", Name: "shared", Pods: []string{"p1", "p2"}, GPU: "GPU-0", MemoryBytes: 8 << 30},
		{Namespace: "a", Name: "extra", Pods: []string{"p1"}, GPU: "GPU-0", MemoryBytes: 1 << 30},
		{Namespace: "b", Name: "shared", Pods: []string{"p1"}, GPU: "GPU-0", MemoryBytes: 2 << 30},
	}
	for _, c := range []struct {
		ns, pod string
		want    scheduler.Claim
		ok      bool
	}{
		{"a", "p2", scheduler.Claim{Key: "a/shared", Memory: 8 << 30}, true},
		{"a", "p1", scheduler.Claim{Key: "a/extra,a/shared", Memory: 9 << 30}, true},
		{"b", "p1", scheduler.Claim{Key: "b/shared", Memory: 2 << 30}, true},
		{"b", "p2", scheduler.Claim{}, false},
	} {
		got, ok := ledgerOf(claims, c.ns, c.pod)
		if got != c.want || ok != c.ok {
			t.Errorf("ledgerOf(%s/%s) = %+v, %v; want %+v, %v", c.ns, c.pod, got, ok, c.want, c.ok)
		}
	}
}
