package owner_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
)

// lister serves the pods it is set to; err, when set, fails the lists.
type lister struct {
	mu   sync.Mutex
	pods []*podresourcesv1.PodResources
	err  error
}

func (l *lister) List(context.Context, *podresourcesv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &podresourcesv1.ListPodResourcesResponse{PodResources: l.pods}, l.err
}

func (l *lister) set(pods ...*podresourcesv1.PodResources) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = pods
}

func claim(name string, units ...string) owner.Claim {
	return owner.Claim{UID: types.UID("uid-" + name), Namespace: "ml", Name: name, Units: units}
}

func newOwners(l owner.Lister) (*owner.Owners, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
	return owner.New(l, 10*time.Second, clk), clk
}

// A device plugin pod on GPU 0 (a replica of it, under any resource) makes a claim on GPU 0 wait, with an
// error naming the pod; the claim is prepared once the pod is gone. A claim on another GPU is not held up.
func TestAClaimWaitsForTheDevicePluginPodHoldingItsGPU(t *testing.T) {
	ctx := context.Background()
	l := &lister{}
	l.set(fakekubelet.Pod("web", "dp-pod", "gpusharing.io/gpu-timeslice", share.ReplicaID("GPU-0", 1)))
	o, _ := newOwners(l)
	err := o.TakeForClaim(ctx, claim("on-0", "GPU-0"))
	if !errors.Is(err, owner.ErrHeldByDevicePlugin) || !strings.Contains(err.Error(), "web/dp-pod") || !strings.Contains(err.Error(), "waits") {
		t.Fatalf("claim on the GPU a device plugin pod holds: %v, want ErrHeldByDevicePlugin naming web/dp-pod and that it waits", err)
	}
	if _, held := o.HeldByDRA("GPU-0"); held {
		t.Errorf("a refused claim holds GPU-0")
	}
	if err := o.TakeForClaim(ctx, claim("on-1", "GPU-1")); err != nil {
		t.Errorf("claim on a free GPU: %v", err)
	}
	l.set()
	if err := o.TakeForClaim(ctx, claim("on-0", "GPU-0")); err != nil {
		t.Errorf("claim once the pod is gone: %v", err)
	}
	if who, held := o.HeldByDRA("GPU-0"); !held || who != "ml/on-0" {
		t.Errorf("GPU-0 held by %q (%v), want ml/on-0", who, held)
	}
}

// A MIG instance is its own unit: a device plugin pod on one instance leaves the GPU's other instances to
// claims.
func TestAMIGInstanceIsItsOwnUnit(t *testing.T) {
	l := &lister{}
	l.set(fakekubelet.Pod("web", "mig-pod", "nvidia.com/mig-1g.5gb", "MIG-a"))
	o, _ := newOwners(l)
	migA := share.Device{Kind: share.KindMIG, GPUUUID: "GPU-0", VisibleUUID: "MIG-a"}
	migB := share.Device{Kind: share.KindMIG, GPUUUID: "GPU-0", VisibleUUID: "MIG-b"}
	if err := o.TakeForClaim(context.Background(), claim("b", owner.UnitOf(migB))); err != nil {
		t.Errorf("claim on another instance of the GPU: %v", err)
	}
	if err := o.TakeForClaim(context.Background(), claim("a", owner.UnitOf(migA))); !errors.Is(err, owner.ErrHeldByDevicePlugin) {
		t.Errorf("claim on the instance the pod holds: %v, want ErrHeldByDevicePlugin", err)
	}
	if u := owner.UnitOf(share.Device{Kind: share.KindMPS, GPUUUID: "GPU-0", VisibleUUID: "GPU-0"}); u != "GPU-0" {
		t.Errorf("an MPS share's unit is %q, want its GPU", u)
	}
}

// A prepared claim makes the device plugin's Allocate on its GPU fail with an error naming the claim,
// until the claim is released; the device plugin's GPUs are told changed each time.
func TestAPreparedClaimRefusesTheDevicePlugin(t *testing.T) {
	o, _ := newOwners(&lister{})
	if err := o.TakeForClaim(context.Background(), claim("train", "GPU-1")); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, o)
	err := o.TakeForDevicePlugin([]string{"GPU-1"})
	if !errors.Is(err, owner.ErrHeldByDRA) || !strings.Contains(err.Error(), "ResourceClaim ml/train") {
		t.Fatalf("Allocate on a claimed GPU: %v, want ErrHeldByDRA naming ml/train", err)
	}
	if err := o.TakeForDevicePlugin([]string{"GPU-0"}); err != nil {
		t.Errorf("Allocate on a free GPU: %v", err)
	}
	o.Release(claim("train").UID)
	waitChanged(t, o)
	if err := o.TakeForDevicePlugin([]string{"GPU-1"}); err != nil {
		t.Errorf("Allocate once the claim is released: %v", err)
	}
}

// An Allocate counts before the kubelet's PodResources shows its pod: a claim is refused while it is in
// flight, and while a pod holds it; once the pod is gone the claim is prepared. An allocation whose pod
// never shows (the kubelet rejected it) stops counting after the grace.
func TestAnAllocationInFlightHoldsItsGPU(t *testing.T) {
	ctx := context.Background()
	l := &lister{}
	o, clk := newOwners(l)
	if err := o.TakeForDevicePlugin([]string{"GPU-0", "GPU-1"}); err != nil {
		t.Fatal(err)
	}
	if err := o.TakeForClaim(ctx, claim("c", "GPU-0")); !errors.Is(err, owner.ErrHeldByDevicePlugin) || !strings.Contains(err.Error(), "admitting") {
		t.Fatalf("claim while an Allocate is in flight: %v, want ErrHeldByDevicePlugin", err)
	}
	clk.Step(time.Second)
	l.set(fakekubelet.Pod("web", "p0", "nvidia.com/gpu", "GPU-0"))
	if err := o.TakeForClaim(ctx, claim("c", "GPU-0")); !errors.Is(err, owner.ErrHeldByDevicePlugin) || !strings.Contains(err.Error(), "web/p0") {
		t.Fatalf("claim once PodResources shows the pod: %v", err)
	}
	clk.Step(time.Second)
	l.set()
	if err := o.TakeForClaim(ctx, claim("c", "GPU-0")); err != nil {
		t.Errorf("claim once the pod is gone: %v", err)
	}
	// GPU-1's pod never showed: it holds the GPU within the grace, not after.
	if err := o.TakeForClaim(ctx, claim("d", "GPU-1")); !errors.Is(err, owner.ErrHeldByDevicePlugin) {
		t.Errorf("claim within the grace of an allocation not shown yet: %v", err)
	}
	clk.Step(10 * time.Second)
	if err := o.TakeForClaim(ctx, claim("d", "GPU-1")); err != nil {
		t.Errorf("claim past the grace of an allocation the kubelet never showed: %v", err)
	}
}

// Could not check is not free: a claim is refused while the kubelet's PodResources cannot be read.
func TestAClaimWaitsWhileThePodResourcesCannotBeRead(t *testing.T) {
	l := &lister{err: errors.New("kubelet restarting")}
	o, _ := newOwners(l)
	if err := o.TakeForClaim(context.Background(), claim("c", "GPU-0")); !errors.Is(err, owner.ErrUnknownHolders) {
		t.Fatalf("claim with no PodResources: %v, want ErrUnknownHolders", err)
	}
	if _, held := o.HeldByDRA("GPU-0"); held {
		t.Errorf("a claim refused for want of PodResources holds its GPU")
	}
}

// An Allocate and a prepare racing for one GPU: exactly one of them gets it, every time.
func TestAllocateAndPrepareRacingForOneGPUGiveItToExactlyOne(t *testing.T) {
	for i := range 200 {
		o := owner.New(&lister{}, time.Minute, nil)
		var wg sync.WaitGroup
		var dpErr, draErr error
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; dpErr = o.TakeForDevicePlugin([]string{"GPU-0"}) }()
		go func() { defer wg.Done(); <-start; draErr = o.TakeForClaim(context.Background(), claim("c", "GPU-0")) }()
		close(start)
		wg.Wait()
		if (dpErr == nil) == (draErr == nil) {
			t.Fatalf("try %d: Allocate %v, prepare %v: want exactly one to succeed", i, dpErr, draErr)
		}
	}
}

// SetClaims, from a checkpoint read after a restart, makes its claims hold their GPUs again.
func TestTheCheckpointsClaimsHoldTheirGPUsAfterARestart(t *testing.T) {
	o, _ := newOwners(&lister{})
	o.SetClaims([]owner.Claim{claim("kept", "GPU-2", "GPU-2")})
	waitChanged(t, o)
	if err := o.TakeForDevicePlugin([]string{"GPU-2"}); !errors.Is(err, owner.ErrHeldByDRA) {
		t.Errorf("Allocate on a GPU of a checkpointed claim: %v, want ErrHeldByDRA", err)
	}
	o.SetClaims(nil)
	if err := o.TakeForDevicePlugin([]string{"GPU-2"}); err != nil {
		t.Errorf("Allocate once the checkpoint no longer holds the claim: %v", err)
	}
}

func waitChanged(t *testing.T, o *owner.Owners) {
	t.Helper()
	select {
	case <-o.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("the owners did not signal a change")
	}
}

// Watch follows the device plugin's pods: a unit a pod holds, or an Allocate in flight, is
// HeldByDevicePlugin, and each change of that set is told through onChange (the ResourceSlices leave such
// units out).
func TestWatchTellsWhichUnitsTheDevicePluginHolds(t *testing.T) {
	l := &lister{}
	o := owner.New(l, time.Minute, nil)
	changes := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); o.Watch(ctx, 10*time.Millisecond, func() { changes <- struct{}{} }) }()
	t.Cleanup(func() { cancel(); <-done })
	held := func(unit string, want bool) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for o.HeldByDevicePlugin(unit) != want {
			select {
			case <-changes:
			case <-deadline:
				t.Fatalf("HeldByDevicePlugin(%s) stays %v", unit, !want)
			}
		}
	}
	l.set(fakekubelet.Pod("web", "p", "nvidia.com/mig-1g.5gb", "MIG-a"))
	held("MIG-a", true)
	held("GPU-0", false)
	l.set()
	held("MIG-a", false)
	if err := o.TakeForDevicePlugin([]string{"GPU-0"}); err != nil {
		t.Fatal(err)
	}
	held("GPU-0", true)
}
