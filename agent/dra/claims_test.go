package dra_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// heldClaim creates a claim whose status says the scheduler allocated device of driver in pool and
// reserved it for the pods, as kube-scheduler writes it.
func heldClaim(t *testing.T, ctx context.Context, c client.Client, name, driver, pool, device string, pods ...*corev1.Pod) {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mps"}}}}}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if device == "" {
		return
	}
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: pool, Device: device}}}}
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	if err := c.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
}

func TestTheDrainWaitsForThePodsHoldingClaimsOnTheGPU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := testenv.StartForTest(t)
	c := env.Client
	mps := env.RunningPod(t, ctx, "default", "mps-client", nil)
	mig := env.RunningPod(t, ctx, "default", "mig-client", nil)
	other := env.RunningPod(t, ctx, "default", "other", nil)
	heldClaim(t, ctx, c, "mps", dra.DriverName, nodeName, "gpu-1-mps-0", mps)
	heldClaim(t, ctx, c, "mig", dra.DriverName, nodeName, "gpu-1-mig-0000-1a", mig)
	// None of these is GPU 1's: GPU 10 (and its MIG instance), GPU 1 of another node, another driver's
	// gpu-1, a claim not allocated.
	heldClaim(t, ctx, c, "gpu10", dra.DriverName, nodeName, "gpu-10", other)
	heldClaim(t, ctx, c, "gpu10-mig", dra.DriverName, nodeName, "gpu-10-mig-0000-1a", other)
	heldClaim(t, ctx, c, "elsewhere", dra.DriverName, "other-node", "gpu-1", other)
	heldClaim(t, ctx, c, "foreign", "gpu.example.com", nodeName, "gpu-1", other)
	heldClaim(t, ctx, c, "pending", dra.DriverName, nodeName, "")

	holders := dra.ClaimHolders{Reader: c, Node: nodeName}
	got, err := holders.PodsHoldingGPU(ctx, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []vacate.PodRef{{Namespace: "default", Name: "mig-client"}, {Namespace: "default", Name: "mps-client"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("pods holding GPU 1 = %v, want %v", got, want)
	}

	// The drain, on a node without the device plugin, waits for both and ends when they do.
	steps := make(chan vacate.Step, 64)
	d := &vacate.Vacater{Claims: holders, Pods: c, NodeName: nodeName, PollInterval: 50 * time.Millisecond}
	type result struct {
		res vacate.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := d.Vacate(ctx, vacate.Request{GPUUUID: "GPU-1", GPUIndex: 1, MIGUUIDs: []string{"MIG-0000-1a"},
			Mode: v1alpha1.DrainWaitForIdle, Timeout: 30 * time.Second, Progress: func(s vacate.Step) { steps <- s }})
		done <- result{res, err}
	}()
	for s := range steps {
		if s.Kind == vacate.StepListed {
			if !reflect.DeepEqual(s.Pods, want) {
				t.Errorf("drain listed %v, want %v", s.Pods, want)
			}
			break
		}
	}
	env.SetPodPhase(t, ctx, mps, corev1.PodSucceeded)
	if err := c.Delete(ctx, mig, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr(mig.UID)}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !reflect.DeepEqual(r.res.Found, want) || len(r.res.Remaining) != 0 {
		t.Errorf("drain = found %v remaining %v, %v; want found %v and idle", r.res.Found, r.res.Remaining, r.err, want)
	}
}

func ptr(u types.UID) *types.UID { return &u }

// A drain scoped to what a fixed-layout change takes (claim a's instance, the fixed instance MIG-f's
// claim) lists only their pods: claim b's pod on the same dynamic GPU is left running.
func TestAScopedDrainListsOnlyThePodsOfTheClaimsItTakes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := testenv.StartForTest(t)
	c := env.Client
	podA := env.RunningPod(t, ctx, "default", "pod-a", nil)
	podB := env.RunningPod(t, ctx, "default", "pod-b", nil)
	podF := env.RunningPod(t, ctx, "default", "pod-f", nil)
	heldClaim(t, ctx, c, "a", dra.DriverName, nodeName, "gpu-0-mig-2g-20gb-0", podA)
	heldClaim(t, ctx, c, "b", dra.DriverName, nodeName, "gpu-0-mig-1g-10gb-6", podB)
	heldClaim(t, ctx, c, "f", dra.DriverName, nodeName, dra.MIGDeviceName(0, "MIG-f"), podF)
	var a resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "a"}, &a); err != nil {
		t.Fatal(err)
	}
	holders := dra.ClaimHolders{Reader: c, Node: nodeName}
	scope := &vacate.ClaimScope{Claims: []types.UID{a.UID}, Devices: []string{dra.MIGDeviceName(0, "MIG-f")}}
	got, err := holders.PodsHoldingGPU(ctx, 0, scope)
	if err != nil {
		t.Fatal(err)
	}
	want := []vacate.PodRef{{Namespace: "default", Name: "pod-a"}, {Namespace: "default", Name: "pod-f"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("pods the scoped drain lists = %v, want %v", got, want)
	}
	// The drain under that scope ends once they end, with pod-b still running.
	d := &vacate.Vacater{Claims: holders, Pods: c, NodeName: nodeName, PollInterval: 50 * time.Millisecond}
	env.SetPodPhase(t, ctx, podA, corev1.PodSucceeded)
	env.SetPodPhase(t, ctx, podF, corev1.PodSucceeded)
	res, err := d.Vacate(ctx, vacate.Request{GPUUUID: "GPU-0", GPUIndex: 0, ClaimScope: scope, Mode: v1alpha1.DrainWaitForIdle, Timeout: 30 * time.Second})
	if err != nil || len(res.Found) != 0 {
		t.Errorf("scoped drain = found %v, %v; want idle at once with pod-b running", res.Found, err)
	}
	if all, _ := holders.PodsHoldingGPU(ctx, 0, nil); len(all) != 3 {
		t.Errorf("unscoped, the GPU's claim pods are %v; want all three listed", all)
	}
}
