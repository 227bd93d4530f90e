package dra_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

const nodeName = "dra-node"

// draCluster starts a real API server with this test's node Ready and the operator's DeviceClasses applied.
func draCluster(t *testing.T) (context.Context, *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	env := testenv.StartForTest(t)
	if _, err := env.ReadyNode(ctx, nodeName); err != nil {
		t.Fatal(err)
	}
	if err := env.ApplyDeviceClasses(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, env
}

// startScheduler runs the real kube-scheduler v1.36.3 (hack/build-control-plane.sh) against env.
func startScheduler(t *testing.T, env *testenv.Env) {
	t.Helper()
	s, err := env.StartScheduler(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("kube-scheduler log (tail):\n%s", s.LogTail(3000))
		}
	})
}

// startClaimController runs kube-controller-manager v1.36.3 with only its ResourceClaim controller, which
// takes a pod that ended out of its claims' reservedFor and deallocates a claim nobody reserves: that is
// what gives a deleted claim's capacity back to the scheduler.
func startClaimController(t *testing.T, env *testenv.Env) {
	t.Helper()
	s, err := env.StartControllerManager(t.TempDir(), "resourceclaim-controller")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("kube-controller-manager log (tail):\n%s", s.LogTail(3000))
		}
	})
}

// mixedNode is a node status with every kind of share: GPU 0 in MIG (3g.40gb + four 1g.10gb), GPU 1
// MPS x2 at 50%, GPU 2 MPS x4 at 25%, GPU 3 time-sliced x2, GPU 4 shim-shared with a budget, GPU 5
// whole, GPU 6 whole but unhealthy, GPU 7 whole but draining.
func mixedNode() v1alpha1.GPUNodeStatus {
	gi := func(i int, opts ...func(*v1alpha1.GPUStatus)) v1alpha1.GPUStatus {
		g := v1alpha1.GPUStatus{Index: int32(i), UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Product: "NVIDIA H100 80GB HBM3",
			Memory: resource.NewQuantity(80<<30, resource.BinarySI), Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}}
		for _, o := range opts {
			o(&g)
		}
		return g
	}
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	return v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{
		gi(0, func(g *v1alpha1.GPUStatus) {
			g.MIGMode = &v1alpha1.MIGModeStatus{Current: "Enabled"}
			g.MIGProfiles = []v1alpha1.MIGProfile{{Name: "1g.10gb", Memory: q("9984Mi")}, {Name: "3g.40gb", Memory: q("40448Mi")}}
			g.Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMIG, MIGInstances: []v1alpha1.MIGInstanceStatus{
				{Profile: "3g.40gb", UUID: "MIG-0000-3g"}, {Profile: "1g.10gb", UUID: "MIG-0000-1a"}, {Profile: "1g.10gb", UUID: "MIG-0000-1b"},
				{Profile: "1g.10gb", UUID: "MIG-0000-1c"}, {Profile: "1g.10gb", UUID: "MIG-0000-1d"}}}
		}),
		gi(1, func(g *v1alpha1.GPUStatus) {
			g.Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 2, ActiveThreadPercentage: 50, PinnedMemoryLimit: q("8Gi")}}
		}),
		gi(2, func(g *v1alpha1.GPUStatus) {
			g.Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 4, ActiveThreadPercentage: 25}}
		}),
		gi(3, func(g *v1alpha1.GPUStatus) {
			g.Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2}}
		}),
		gi(4, func(g *v1alpha1.GPUStatus) {
			g.Applied.Shim = &v1alpha1.ShimStatus{MemoryBudget: q("60Gi")}
		}),
		gi(5),
		gi(6, func(g *v1alpha1.GPUStatus) {
			g.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonXidError}}
		}),
		gi(7, func(g *v1alpha1.GPUStatus) { g.Drain = &v1alpha1.GPUDrainStatus{Phase: v1alpha1.DrainPhaseDraining} }),
	}}
}

// claimPod creates a ResourceClaim for one device of class (narrowed by cel when set) and a pod that uses it.
func claimPod(t *testing.T, ctx context.Context, c client.Client, name, class, cel string) {
	t.Helper()
	req := resourcev1.DeviceRequest{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class}}
	if cel != "" {
		req.Exactly.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: cel}}}
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{req}}}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	podFor(t, ctx, c, name)
}

// podFor creates a pod named like the claim it uses.
func podFor(t *testing.T, ctx context.Context, c client.Client, name string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "c", Image: "local/cuda:1", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
		}}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
}

// allocated waits for the claim's allocation and returns the device it got.
func allocated(t *testing.T, ctx context.Context, c client.Client, name string) string {
	t.Helper()
	var claim resourcev1.ResourceClaim
	wait.Until(t, 60*time.Second, func() bool {
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &claim)
		return err == nil && claim.Status.Allocation != nil
	}, "claim %s allocated", name)
	r := claim.Status.Allocation.Devices.Results
	if len(r) != 1 || r[0].Driver != dra.DriverName || r[0].Pool != nodeName {
		t.Fatalf("claim %s allocated %+v", name, r)
	}
	return r[0].Device
}

func TestTheSchedulerAllocatesEachKindOfShareFromThePublishedSlices(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	publish(t, ctx, env, startPublisher(t, env, dra.PublisherOptions{}), dra.Devices(mixedNode(), share.DefaultConfig()))
	startScheduler(t, env)

	attr := `device.attributes["gpu.gpusharing.io"]`
	for _, tt := range []struct {
		name, class, cel, want string
	}{
		{"whole", "gpusharing-exclusive", "", "gpu-5"},
		{"mig-3g", "gpusharing-mig", attr + `.migProfile == "3g.40gb"`, "gpu-0-mig-0000-3g"},
		{"mps-half", "gpusharing-mps", attr + `.mpsActiveThreadPercentage >= 50`, "gpu-1-mps-"},
		{"mps-quarter", "gpusharing-mps", attr + `.mpsActiveThreadPercentage < 50`, "gpu-2-mps-"},
		{"timesliced", "gpusharing-timeslicing", "", "gpu-3-timeslicing-"},
		{"shared", "gpusharing-shared", attr + `.oversubscription`, "gpu-4-shared-"},
		{"mig-small", "gpusharing-mig", `device.capacity["gpu.gpusharing.io"].memory.compareTo(quantity("10Gi")) <= 0`, "gpu-0-mig-0000-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			claimPod(t, ctx, c, tt.name, tt.class, tt.cel)
			if got := allocated(t, ctx, c, tt.name); !strings.HasPrefix(got, tt.want) {
				t.Errorf("claim %s got device %s, want %s*", tt.name, got, tt.want)
			}
		})
	}

	// The one whole healthy GPU is taken; GPU 6 is unhealthy and GPU 7 draining, so they are not offered.
	claimPod(t, ctx, c, "whole-2", "gpusharing-exclusive", "")
	msg := pendingReason(t, ctx, c, "whole-2")
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod whole-2 is pending with %q; want the scheduler's reason about claims", msg)
	}
}

// pendingReason waits until the scheduler reports the pod unschedulable and returns its message; it
// fails when the pod is bound.
func pendingReason(t *testing.T, ctx context.Context, c client.Client, name string) string {
	t.Helper()
	var msg string
	wait.Until(t, 60*time.Second, func() bool {
		var pod corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &pod); err != nil {
			return false
		}
		if pod.Spec.NodeName != "" {
			t.Fatalf("pod %s was bound to %s", name, pod.Spec.NodeName)
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				msg = cond.Message
				return true
			}
		}
		return false
	}, "pod %s reported unschedulable", name)
	return msg
}

// The slices follow the status: a GPU turning unhealthy leaves, one whose drain ended comes back. The
// pool is one slice, which one write changes whole, so its generation stays; a pool of several slices
// changed by several writes gets a new one, so the scheduler never mixes the old slices and the new.
func TestTheSlicesFollowTheStatus(t *testing.T) {
	ctx, env := draCluster(t)
	p := startPublisher(t, env, dra.PublisherOptions{})
	st := mixedNode()
	cfg := share.DefaultConfig()
	publish(t, ctx, env, p, dra.Devices(st, cfg))
	names, gen1, _ := published(t, ctx, env.Client)
	if !strings.Contains(names, "gpu-5") || strings.Contains(names, "gpu-6") || strings.Contains(names, "gpu-7") {
		t.Fatalf("published %s: want gpu-5, and neither the unhealthy gpu-6 nor the draining gpu-7", names)
	}
	st.GPUs[5].Conditions[0].Status = metav1.ConditionFalse
	st.GPUs[7].Drain = nil
	publish(t, ctx, env, p, dra.Devices(st, cfg))
	names, gen2, _ := published(t, ctx, env.Client)
	if strings.Contains(names, "gpu-5") || !strings.Contains(names, "gpu-7") || gen2 != gen1 {
		t.Errorf("after the change: generation %d (was %d), devices %s; want gpu-5 gone, gpu-7 back, one slice updated in place", gen2, gen1, names)
	}

	// 200 devices take two slices: both are written under a new generation.
	var many []resourcev1.Device
	for i := range 200 {
		many = append(many, resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i)})
	}
	publish(t, ctx, env, p, many)
	if _, gen3, _ := published(t, ctx, env.Client); gen3 <= gen2 || len(nodeSlices(t, ctx, env.Client)) != 2 {
		t.Errorf("a change written as two slices kept generation %d (was %d)", gen3, gen2)
	}
}

// sizedNode is a node with one GPU of 40 GiB (an A100 40GB) sized per claim over MPS with 8 replicas (a
// claim that asks nothing gets 5Gi and 12 % of the SMs), step and minimum 1Gi: claims of 4, 10, 20 and 6
// GiB fill its memory exactly.
func sizedNode() v1alpha1.GPUNodeStatus {
	step := resource.MustParse("1Gi")
	return v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{{
		Index: 0, UUID: "GPU-00000000-0000-0000-0000-00000000a100", Product: "NVIDIA A100-SXM4-40GB",
		Memory: resource.NewQuantity(40<<30, resource.BinarySI),
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSStatus{State: "Running", Replicas: 8},
			Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &step}},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}},
	}}}
}

// sizedClaimPod creates a claim of the sized class asking for memory and compute (each when set),
// narrowed by cel when set, and a pod that uses it.
func sizedClaimPod(t *testing.T, ctx context.Context, c client.Client, name, memory, compute, cel string) {
	t.Helper()
	requests := map[resourcev1.QualifiedName]resource.Quantity{}
	if memory != "" {
		requests[dra.CapacityMemory] = resource.MustParse(memory)
	}
	if compute != "" {
		requests[dra.CapacityCompute] = resource.MustParse(compute)
	}
	req := resourcev1.DeviceRequest{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized",
		Capacity: &resourcev1.CapacityRequirements{Requests: requests}}}
	if cel != "" {
		req.Exactly.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: cel}}}
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{req}}}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	podFor(t, ctx, c, name)
}

// consumed waits for the claim's allocation and returns its one result.
func consumed(t *testing.T, ctx context.Context, c client.Client, name string) resourcev1.DeviceRequestAllocationResult {
	t.Helper()
	allocated(t, ctx, c, name)
	var claim resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &claim); err != nil {
		t.Fatal(err)
	}
	return claim.Status.Allocation.Devices.Results[0]
}

func TestTheSchedulerPacksSizedClaimsOntoAGPUUntilItsMemoryIsUsed(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	publish(t, ctx, env, startPublisher(t, env, dra.PublisherOptions{}), dra.Devices(sizedNode(), share.DefaultConfig()))
	slices := nodeSlices(t, ctx, c)
	if len(slices) != 1 || len(slices[0].Spec.Devices) != 1 {
		t.Fatalf("published %+v; want one slice with the one sized device", slices)
	}
	if d := slices[0].Spec.Devices[0]; d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || d.Capacity[dra.CapacityMemory].RequestPolicy == nil {
		t.Fatalf("the API server dropped the consumable capacity fields (is DRAConsumableCapacity off?): %+v", d)
	}
	startScheduler(t, env)
	startClaimController(t, env)

	// 3500Mi is rounded up to the 1Gi step; a claim that asks no compute gets the default, 100/8 percent.
	for _, tt := range []struct {
		name, memory, compute   string
		wantMemory, wantCompute string
	}{
		{"sized-4", "3500Mi", "", "4Gi", "12"},
		{"sized-10", "10Gi", "30", "10Gi", "30"},
		{"sized-20", "20Gi", "40", "20Gi", "40"},
		{"sized-6", "6Gi", "10", "6Gi", "10"},
	} {
		sizedClaimPod(t, ctx, c, tt.name, tt.memory, tt.compute, "")
		r := consumed(t, ctx, c, tt.name)
		if r.Device != "gpu-0-sized" || r.ShareID == nil {
			t.Fatalf("claim %s: device %s share %v; want a share of gpu-0-sized", tt.name, r.Device, r.ShareID)
		}
		mem, compute := r.ConsumedCapacity[dra.CapacityMemory], r.ConsumedCapacity[dra.CapacityCompute]
		if mem.Cmp(resource.MustParse(tt.wantMemory)) != 0 || compute.Cmp(resource.MustParse(tt.wantCompute)) != 0 {
			t.Errorf("claim %s consumes memory %s compute %s; want %s and %s", tt.name, mem.String(), compute.String(), tt.wantMemory, tt.wantCompute)
		}
	}

	// 40 GiB are taken (92 % of the SMs): the next claim, however small, waits.
	sizedClaimPod(t, ctx, c, "sized-next", "1Gi", "1", "")
	msg := pendingReason(t, ctx, c, "sized-next")
	t.Logf("a claim on the full GPU: PodScheduled=False: %s", msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod sized-next is pending with %q; want the scheduler's reason about claims", msg)
	}
	// More than any GPU has never fits.
	sizedClaimPod(t, ctx, c, "sized-huge", "41Gi", "", "")
	msg = pendingReason(t, ctx, c, "sized-huge")
	t.Logf("a claim larger than any GPU: PodScheduled=False: %s", msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod sized-huge is pending with %q; want the scheduler's reason about claims", msg)
	}

	// The 10 GiB claim ends: its memory goes to the waiting claim.
	for _, obj := range []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sized-10"}},
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sized-10"}},
	} {
		if err := c.Delete(ctx, obj, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	if r := consumed(t, ctx, c, "sized-next"); r.Device != "gpu-0-sized" {
		t.Errorf("claim sized-next got %s after sized-10 was deleted, want gpu-0-sized", r.Device)
	}
	// Compute adds up too: 63 % of the SMs are taken (12 + 40 + 10 + 1), so a claim of 40 % waits with
	// memory to spare (5Gi are free), and one of 37 % fits exactly.
	sizedClaimPod(t, ctx, c, "sized-compute-40", "1Gi", "40", "")
	if msg := pendingReason(t, ctx, c, "sized-compute-40"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod sized-compute-40 is pending with %q; want the scheduler's reason about claims", msg)
	}
	sizedClaimPod(t, ctx, c, "sized-compute-37", "1Gi", "37", "")
	if r := consumed(t, ctx, c, "sized-compute-37"); r.Device != "gpu-0-sized" {
		t.Errorf("claim sized-compute-37 got %s, want gpu-0-sized", r.Device)
	}
	var huge resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "sized-huge"}, &huge); err != nil {
		t.Fatal(err)
	}
	if huge.Status.Allocation != nil {
		t.Errorf("claim sized-huge (41Gi) was allocated %+v on a 40 GiB GPU", huge.Status.Allocation.Devices.Results)
	}
}
