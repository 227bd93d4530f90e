package deviceplugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpusharing/gpusharing/agent/owner"
)

// Beside DRA, a GPU a prepared claim holds has its devices advertised Unhealthy (a MIG instance alone:
// the GPU's other instances stay Healthy) and Allocate of one is refused naming the claim; once the claim
// is gone they are Healthy and allocated again, and the allocation holds the GPU against claims.
func TestDevicesOfAGPUAClaimHoldsAreUnhealthyAndRefused(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m, err := NewManager(testConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	owners := owner.New(&countingLister{}, 0, nil)
	m.SetOwners(owners)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := m.UpdateFromStatus(ctx, everyMode()); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy("GPU-ts::0", "GPU-ts::1", "GPU-ts::2")); err != nil {
		t.Fatal(err)
	}

	owners.SetClaims([]owner.Claim{{UID: "u1", Namespace: "ml", Name: "train", Units: []string{"GPU-ts"}},
		{UID: "u2", Namespace: "ml", Name: "small", Units: []string{"MIG-a"}}})
	if err := k.WaitForDevices(ctx, resTimeSlice, map[string]string{"GPU-ts::0": "Unhealthy", "GPU-ts::1": "Unhealthy", "GPU-ts::2": "Unhealthy"}); err != nil {
		t.Fatalf("the replicas of the claimed GPU: %v", err)
	}
	if err := k.WaitForDevices(ctx, resMIG1g, map[string]string{"MIG-a": "Unhealthy", "MIG-b": "Healthy"}); err != nil {
		t.Fatalf("the MIG instances: %v", err)
	}
	ts := dialPlugin(t, k, string(resTimeSlice))
	if _, err := ts.AllocateOne(ctx, "GPU-ts::2"); err == nil || !strings.Contains(err.Error(), "ResourceClaim ml/train") {
		t.Fatalf("Allocate of a replica of the claimed GPU: %v, want refused naming ml/train", err)
	}
	if _, err := dialPlugin(t, k, string(resMIG1g)).AllocateOne(ctx, "MIG-b"); err != nil {
		t.Fatalf("Allocate of the instance no claim holds: %v", err)
	}

	owners.SetClaims(nil)
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy("GPU-ts::0", "GPU-ts::1", "GPU-ts::2")); err != nil {
		t.Fatalf("once the claim is gone: %v", err)
	}
	if _, err := ts.AllocateOne(ctx, "GPU-ts::2"); err != nil {
		t.Fatalf("Allocate once the claim is gone: %v", err)
	}
	err = owners.TakeForClaim(ctx, owner.Claim{UID: "u3", Namespace: "ml", Name: "late", Units: []string{"GPU-ts"}})
	if !errors.Is(err, owner.ErrHeldByDevicePlugin) {
		t.Errorf("a claim right after the Allocate: %v, want ErrHeldByDevicePlugin", err)
	}
}
