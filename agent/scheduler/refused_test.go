package scheduler

import (
	"sync"
	"testing"
)

func TestChargeRefusedIsToldWithTheDemandItHadAtTheClaim(t *testing.T) {
	var mu sync.Mutex
	var got []ChargeRefusal
	e := startLedgerEnv(t, func(g *Guards) {
		g.OnChargeRefused = func(r ChargeRefusal) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, r)
		}
	})
	a, _ := e.dial(t, Claim{Key: testClaimKey, Memory: 1024 * mib})
	if m := charge(t, a, 1, 700*mib); m.Charge != ChargeOK {
		t.Fatalf("a charge of 700 MiB = %+v, want granted", m)
	}
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("a granted charge was told as refused: %+v", got)
	}
	if m := charge(t, a, 2, 200*mib); m.Charge != ChargeRefused {
		t.Fatalf("a charge of 200 MiB with 68 MiB left = %+v, want refused", m)
	}
	mu.Lock()
	defer mu.Unlock()
	// The reserve (256 MiB) + the grant (700 MiB) + the 200 MiB asked: what the claim would have held.
	want := ChargeRefusal{GPU: "GPU-test", Key: testClaimKey, Claim: 1024 * mib, Demand: 1156 * mib}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("refusals told = %+v, want [%+v]", got, want)
	}
}
