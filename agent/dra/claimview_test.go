package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// sizedHeldClaim is a claim the scheduler allocated a share of device (a sized device) with memory in
// pool, reserved for pods (names in "default").
func sizedHeldClaim(t *testing.T, ctx context.Context, c client.Client, name, pool, device, memory string, pods ...string) *resourcev1.ResourceClaim {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized"}}}}}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	allocate(t, ctx, c, claim, pool, device, memory, pods...)
	return claim
}

// allocate writes the scheduler's allocation of a share of device in pool, reserved for pods.
func allocate(t *testing.T, ctx context.Context, c client.Client, claim *resourcev1.ResourceClaim, pool, device, memory string, pods ...string) {
	t.Helper()
	share := uuid.NewUUID()
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: pool, Device: device, ShareID: &share,
			ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory), dra.CapacityCompute: resource.MustParse("10")}}}}}
	reserve(claim, pods...)
	if err := c.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
}

func reserve(claim *resourcev1.ResourceClaim, pods ...string) {
	claim.Status.ReservedFor = nil
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID("uid-" + p)})
	}
}

// runPlugin starts p as the agent does (Start: the sweep and the first read of the node's claims, then
// serving) until the test ends, and returns its client.
func runPlugin(t *testing.T, ctx context.Context, env *testenv.Env, p *dra.KubeletPlugin) kubernetes.Interface {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	h, err := p.Start(runCtx, kube)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(); cancel() })
	return kube
}

// viewString renders a view's claims as "name@gpu memory pods" and its uncertain pods.
func viewString(v dra.ClaimView) string {
	var out []string
	for _, c := range v.Claims {
		out = append(out, fmt.Sprintf("%s@%s %s %v", c.Name, c.GPU[:12], resource.NewQuantity(c.MemoryBytes, resource.BinarySI), c.Pods))
	}
	return fmt.Sprintf("%v uncertain %v", out, v.Uncertain)
}

// The checkpoint knows a shared claim's pods only as they were when it was prepared: a second pod that
// starts on it later is known once the node's claims are read again, which the guard asks for.
func TestTheClaimViewLearnsASharedClaimsSecondPodFromTheAPIServer(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	shared := sizedHeldClaim(t, ctx, c, "shared", nodeName, "gpu-0-sized", "8Gi", "first")
	dirs := newPluginDirs(t)
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p.Update(sizedMPSAndShimNode())
	runPlugin(t, ctx, env, p)
	if err := prepareOne(ctx, p, shared); err != nil {
		t.Fatal(err)
	}
	if got, want := viewString(p.ClaimView()), "[shared@GPU-00000000 8Gi [first]] uncertain []"; got != want {
		t.Fatalf("view after the first prepare: %s, want %s", got, want)
	}
	// The scheduler reserves the claim for a second pod; the kubelet does not prepare it again.
	reserveSecondPod(t, ctx, c, p, viewString, "[shared@GPU-00000000 8Gi [first second]] uncertain []", "the second pod in the view")
}

// A checkpoint moved aside as unreadable knows no claim: the plugin reads the claims allocated in its
// pool (this driver, this node) from the API server before it serves, with their amounts and pods.
// Claims deallocated, or allocated again on another node, leave the checkpoint and the view.
func TestTheClaimViewIsRebuiltFromTheAPIServerAndFollowsAllocations(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	c := env.Client
	sizedHeldClaim(t, ctx, c, "notebook", nodeName, "gpu-0-sized", "10Gi", "nb")
	sizedHeldClaim(t, ctx, c, "trainer", nodeName, "gpu-1-sized", "6Gi", "tr-0", "tr-1")
	sizedHeldClaim(t, ctx, c, "elsewhere", "node-b", "gpu-0-sized", "4Gi", "other")
	heldClaim(t, ctx, c, "fixed", dra.DriverName, nodeName, "gpu-1-mps-0")
	dirs := newPluginDirs(t)
	if err := os.MkdirAll(dirs.plugin, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs.plugin, dra.CheckpointFile), []byte(`{"kind": "gpusharing.io/dra-checkpoint", "vers`), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if v := p.ClaimView(); len(v.Claims) != 0 || !v.SyncedAt.IsZero() {
		t.Fatalf("view of a plugin that has read nothing: %s, synced %v", viewString(v), v.SyncedAt)
	}
	kube := runPlugin(t, ctx, env, p)
	// Before the agent lists its GPUs a sized device's GPU is not known: its pods cannot be judged.
	if got, want := viewString(p.ClaimView()), "[] uncertain [default/nb default/tr-0 default/tr-1]"; got != want {
		t.Errorf("view before any status: %s, want %s", got, want)
	}
	p.Update(sizedMPSAndShimNode())
	if got, want := viewString(p.ClaimView()), "[notebook@GPU-00000000 10Gi [nb] trainer@GPU-00000001 6Gi [tr-0 tr-1]] uncertain []"; got != want {
		t.Errorf("view rebuilt from the API server: %s, want %s", got, want)
	}
	if p.ClaimView().SyncedAt.IsZero() {
		t.Error("no read of the node's claims recorded before the plugin served")
	}

	// Prepared, then deallocated (the checkpoint entry goes), and one allocated again on another node.
	notebook, trainer := getClaim(t, ctx, c, "notebook"), getClaim(t, ctx, c, "trainer")
	for _, claim := range []*resourcev1.ResourceClaim{notebook, trainer} {
		if err := prepareOne(ctx, p, claim); err != nil {
			t.Fatalf("claim %s: %v", claim.Name, err)
		}
	}
	for _, claim := range []*resourcev1.ResourceClaim{notebook, trainer} {
		claim.Status.Allocation, claim.Status.ReservedFor = nil, nil
		if err := c.Status().Update(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	allocate(t, ctx, c, trainer, "node-b", "gpu-0-sized", "6Gi", "tr-0")
	if n, err := p.ForgetGoneClaims(ctx, kube); err != nil || n != 2 {
		t.Fatalf("forgot %d claims (%v), want the deallocated one and the one moved", n, err)
	}
	if got := p.Prepared(); len(got) != 0 {
		t.Errorf("prepared after the sweep: %v, want none", got)
	}
	if got := onDisk(t, dirs); len(got) != 0 {
		t.Errorf("checkpoint after the sweep holds %v", got)
	}
	if err := p.SyncClaims(ctx, kube); err != nil {
		t.Fatal(err)
	}
	if v := p.ClaimView(); len(v.Claims) != 0 || len(v.Uncertain) != 0 {
		t.Errorf("view after both left the node: %s", viewString(v))
	}
}
