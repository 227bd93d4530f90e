package dra_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	kptr "k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// multiGPUNode has GPUs 0 and 1 shim-shared in fixed shares (four each) and GPUs 2 and 3 of 40 GiB
// sized per claim over the shim.
func multiGPUNode() v1alpha1.GPUNodeStatus {
	step := resource.MustParse("1Gi")
	var st v1alpha1.GPUNodeStatus
	for i := range 4 {
		g := v1alpha1.GPUStatus{Index: int32(i), UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-0000000000mg", i), Product: "NVIDIA A100-SXM4-40GB",
			Memory:     resource.NewQuantity(40<<30, resource.BinarySI),
			Applied:    &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive, Shim: &v1alpha1.ShimStatus{}},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}}
		if i >= 2 {
			g.Applied.Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &step}
		}
		st.GPUs = append(st.GPUs, g)
	}
	return st
}

// distinctGPUs is the constraint that puts the named requests' devices (every request's when none is
// named) on distinct GPUs.
func distinctGPUs(requests ...string) resourcev1.DeviceConstraint {
	return resourcev1.DeviceConstraint{Requests: requests, DistinctAttribute: kptr.To(resourcev1.FullyQualifiedName(dra.AttrGPU))}
}

func createClaimPod(t *testing.T, ctx context.Context, c client.Client, name string, spec resourcev1.DeviceClaim) {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: resourcev1.ResourceClaimSpec{Devices: spec}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	podFor(t, ctx, c, name)
}

// A claim asks for shares on distinct GPUs with a distinctAttribute constraint on the GPU's uuid; the
// real kube-scheduler enforces it (a third distinct share on a node with two such GPUs waits), sized
// requests carry each its own size, and the kubelet plugin hands the container every GPU of the set
// in one environment, each GPU's socket and limit keyed by its uuid.
func TestAClaimForSharesOnDistinctGPUsGetsThemTogether(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	st := multiGPUNode()
	publish(t, ctx, env, startPublisher(t, env, dra.PublisherOptions{}), dra.Devices(st, dpConfig))
	startScheduler(t, env)

	shared := func(name string, count int64) resourcev1.DeviceRequest {
		return resourcev1.DeviceRequest{Name: name, Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-shared",
			AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}}
	}
	sized := func(name, memory string) resourcev1.DeviceRequest {
		return resourcev1.DeviceRequest{Name: name, Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized",
			Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}}}}
	}
	createClaimPod(t, ctx, c, "two-shared", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{shared("gpus", 2)}, Constraints: []resourcev1.DeviceConstraint{distinctGPUs()}})
	createClaimPod(t, ctx, c, "sized-pair", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{sized("first", "4Gi"), sized("second", "10Gi")},
		Constraints: []resourcev1.DeviceConstraint{distinctGPUs("first", "second")}})

	gpuOf := func(device string) string { return strings.SplitN(device, "-", 3)[1] }
	results := map[string][]resourcev1.DeviceRequestAllocationResult{}
	for _, name := range []string{"two-shared", "sized-pair"} {
		waitAllocated(t, ctx, c, name)
		r := getClaim(t, ctx, c, name).Status.Allocation.Devices.Results
		if len(r) != 2 || gpuOf(r[0].Device) == gpuOf(r[1].Device) {
			t.Fatalf("claim %s allocated %+v; want two devices on distinct GPUs", name, r)
		}
		results[name] = r
	}
	for i, want := range []string{"4Gi", "10Gi"} {
		r := results["sized-pair"][i]
		if got := r.ConsumedCapacity[dra.CapacityMemory]; !strings.HasSuffix(r.Device, "-sized") || got.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("sized-pair request %s: device %s consumes %s, want a sized device and %s", r.Request, r.Device, got.String(), want)
		}
	}
	// Each shared GPU still has three free shares, but only two GPUs are shared in fixed shares.
	createClaimPod(t, ctx, c, "three-shared", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{shared("gpus", 3)}, Constraints: []resourcev1.DeviceConstraint{distinctGPUs()}})
	if msg := pendingReason(t, ctx, c, "three-shared"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("three shares on distinct GPUs: pending with %q; want the scheduler's reason about claims", msg)
	}

	dirs := newPluginDirs(t)
	kubelet, _ := startPluginWith(t, env, dirs, &st)
	uuid := func(device string) string {
		var i int
		_, _ = fmt.Sscanf(gpuOf(device), "%d", &i)
		return st.GPUs[i].UUID
	}
	for _, tt := range []struct {
		name     string
		requests []string
		limits   bool
	}{
		{"two-shared", []string{"gpus"}, false},
		{"sized-pair", []string{"first", "second"}, true},
	} {
		ref := claimRef(t, ctx, c, tt.name)
		resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			t.Fatal(err)
		}
		got := resp.Claims[ref.Uid]
		if got == nil || got.Error != "" || len(got.Devices) != 2 {
			t.Fatalf("claim %s: %+v", tt.name, got)
		}
		// The first device carries the set's one CDI device for each of its requests; the second none,
		// so a container naming the claim gets the edits once.
		first, second := got.Devices[0], got.Devices[1]
		if len(first.CdiDeviceIds) != 1 || len(second.CdiDeviceIds) != 0 || !reflect.DeepEqual(first.RequestNames, tt.requests) {
			t.Fatalf("claim %s devices %+v; want the first with one CDI device for requests %v, the second with none", tt.name, got.Devices, tt.requests)
		}
		readCDI(t, dirs.cdi, ref.Uid)
		envs, mounts := container(t, dirs.cdi, first.CdiDeviceIds[0])
		a, b := uuid(results[tt.name][0].Device), uuid(results[tt.name][1].Device)
		want := []string{"CUDA_VISIBLE_DEVICES=" + a + "," + b, "GPUSHARE_GPU_UUID=" + a + "," + b,
			"GPUSHARE_SOCKET=" + a + "=/var/run/gpusharing/scheduler/" + a + "/gpushare.sock," + b + "=/var/run/gpusharing/scheduler/" + b + "/gpushare.sock"}
		if tt.limits {
			want = append(want, "GPUSHARE_MEMORY_LIMIT_BYTES="+a+"=4294967296,"+b+"=10737418240")
		}
		for _, w := range want {
			if !slices.Contains(envs, w) {
				t.Errorf("claim %s: the container's env %v lacks %s", tt.name, envs, w)
			}
		}
		for _, g := range []string{a, b} {
			if m := "/run/gpusharing/scheduler/" + g + ":/var/run/gpusharing/scheduler/" + g + ":ro"; !slices.Contains(mounts, m) {
				t.Errorf("claim %s: the container's mounts %v lack %s", tt.name, mounts, m)
			}
		}
	}
}
