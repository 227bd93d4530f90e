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
	"github.com/gpusharing/gpusharing/test/testenv"
)

// multiGPUNode has GPUs 0 and 1 time-sliced without the shim (four replicas each), GPUs 2 and 3
// shim-shared in fixed shares (four each) and GPUs 4 and 5 of 40 GiB sized per claim over the shim;
// GPUs 3 and 5 have a memory budget, so the shim swaps there.
func multiGPUNode() v1alpha1.GPUNodeStatus {
	step := resource.MustParse("1Gi")
	var st v1alpha1.GPUNodeStatus
	for i := range 6 {
		g := v1alpha1.GPUStatus{Index: int32(i), UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-0000000000mg", i), Product: "NVIDIA A100-SXM4-40GB",
			Memory:     resource.NewQuantity(40<<30, resource.BinarySI),
			Applied:    &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive, Shim: &v1alpha1.ShimStatus{}},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}}
		switch {
		case i < 2:
			g.Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4}}
		case i >= 4:
			g.Applied.Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &step}
		}
		if i == 3 || i == 5 {
			g.Applied.Shim.MemoryBudget = resource.NewQuantity(36<<30, resource.BinarySI)
		}
		st.GPUs = append(st.GPUs, g)
	}
	return st
}

// multiGPUCluster is an API server with multiGPUNode's devices published and the real kube-scheduler.
func multiGPUCluster(t *testing.T) (context.Context, *testenv.Env, v1alpha1.GPUNodeStatus) {
	t.Helper()
	ctx, env := draCluster(t)
	st := multiGPUNode()
	publish(t, ctx, env, startPublisher(t, env, dra.PublisherOptions{}), dra.Devices(st, dpConfig))
	startScheduler(t, env)
	return ctx, env, st
}

// exactly is a request for count devices of a DeviceClass.
func exactly(name, class string, count int64) resourcev1.DeviceRequest {
	return resourcev1.DeviceRequest{Name: name, Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class,
		AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}}
}

// gpuIndexOf is the index of the GPU of a device of multiGPUNode (gpu-<index>-...).
func gpuIndexOf(device string) string { return strings.SplitN(device, "-", 3)[1] }

// allocatedOnTwoGPUs waits for the claim's allocation and checks it is two devices on distinct GPUs.
func allocatedOnTwoGPUs(t *testing.T, ctx context.Context, c client.Client, name string) []resourcev1.DeviceRequestAllocationResult {
	t.Helper()
	waitAllocated(t, ctx, c, name)
	r := getClaim(t, ctx, c, name).Status.Allocation.Devices.Results
	if len(r) != 2 || gpuIndexOf(r[0].Device) == gpuIndexOf(r[1].Device) {
		t.Fatalf("claim %s allocated %+v; want two devices on distinct GPUs", name, r)
	}
	return r
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

// A claim asks for time-sliced shares on distinct GPUs with a distinctAttribute constraint on the GPU's
// uuid; the real kube-scheduler enforces it (three distinct shares on a node with two such GPUs wait
// although four replicas are free), and the kubelet plugin hands the container every GPU of the set in
// one environment, with no shim.
func TestAClaimForSharesOnDistinctGPUsGetsThemTogether(t *testing.T) {
	ctx, env, st := multiGPUCluster(t)
	c := env.Client

	createClaimPod(t, ctx, c, "two-timesliced", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{exactly("gpus", "gpusharing-timeslicing", 2)},
		Constraints: []resourcev1.DeviceConstraint{distinctGPUs()}})
	createClaimPod(t, ctx, c, "timesliced-pair", resourcev1.DeviceClaim{
		Requests:    []resourcev1.DeviceRequest{exactly("first", "gpusharing-timeslicing", 1), exactly("second", "gpusharing-timeslicing", 1)},
		Constraints: []resourcev1.DeviceConstraint{distinctGPUs("first", "second")}})
	results := map[string][]resourcev1.DeviceRequestAllocationResult{}
	for _, name := range []string{"two-timesliced", "timesliced-pair"} {
		results[name] = allocatedOnTwoGPUs(t, ctx, c, name)
	}
	// Each time-sliced GPU still has two free replicas, but only two GPUs are time-sliced.
	createClaimPod(t, ctx, c, "three-timesliced", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{exactly("gpus", "gpusharing-timeslicing", 3)},
		Constraints: []resourcev1.DeviceConstraint{distinctGPUs()}})
	if msg := pendingReason(t, ctx, c, "three-timesliced"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("three shares on distinct GPUs: pending with %q; want the scheduler's reason about claims", msg)
	}

	dirs := newPluginDirs(t)
	kubelet, _ := startPluginWith(t, env, dirs, &st)
	uuid := func(device string) string {
		var i int
		_, _ = fmt.Sscanf(gpuIndexOf(device), "%d", &i)
		return st.GPUs[i].UUID
	}
	for _, tt := range []struct {
		name     string
		requests []string
	}{
		{"two-timesliced", []string{"gpus"}},
		{"timesliced-pair", []string{"first", "second"}},
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
		envs, _ := container(t, dirs.cdi, first.CdiDeviceIds[0])
		a, b := uuid(results[tt.name][0].Device), uuid(results[tt.name][1].Device)
		for _, w := range []string{"CUDA_VISIBLE_DEVICES=" + a + "," + b, "NVIDIA_VISIBLE_DEVICES=" + a + "," + b} {
			if !slices.Contains(envs, w) {
				t.Errorf("claim %s: the container's env %v lacks %s", tt.name, envs, w)
			}
		}
		for _, e := range envs {
			if strings.HasPrefix(e, "LD_PRELOAD=") || strings.HasPrefix(e, "GPUSHARE_") {
				t.Errorf("claim %s: time-sliced shares set %s; want no shim", tt.name, e)
			}
		}
	}
}

// A claim for shim shares on distinct GPUs, fixed or sized, is allocated by the scheduler, which knows
// nothing of the shim, and prepared into the list form the shim reads (docs/multigpu.md): each GPU's
// scheduler socket directory mounted under its uuid, and GPUSHARE_GPU_UUID, GPUSHARE_SOCKET,
// GPUSHARE_OVERSUB and GPUSHARE_MEMORY_LIMIT_BYTES listing every GPU in CUDA_VISIBLE_DEVICES order, each
// with its own socket, swapping and claim size. A claim on one GPU keeps the single form.
func TestAClaimForShimSharesOnDistinctGPUsGetsEachGPUInTheListForm(t *testing.T) {
	ctx, env, st := multiGPUCluster(t)
	c := env.Client

	sized := func(name, memory string) resourcev1.DeviceRequest {
		return resourcev1.DeviceRequest{Name: name, Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized",
			Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}}}}
	}
	createClaimPod(t, ctx, c, "two-shared", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{exactly("gpus", "gpusharing-shared", 2)},
		Constraints: []resourcev1.DeviceConstraint{distinctGPUs()}})
	createClaimPod(t, ctx, c, "sized-pair", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{sized("first", "4Gi"), sized("second", "10Gi")},
		Constraints: []resourcev1.DeviceConstraint{distinctGPUs("first", "second")}})
	createClaimPod(t, ctx, c, "one-shared", resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{exactly("gpu", "gpusharing-shared", 1)}})
	results := map[string][]resourcev1.DeviceRequestAllocationResult{"two-shared": allocatedOnTwoGPUs(t, ctx, c, "two-shared")}
	pair := allocatedOnTwoGPUs(t, ctx, c, "sized-pair")
	for i, want := range []string{"4Gi", "10Gi"} {
		if got := pair[i].ConsumedCapacity[dra.CapacityMemory]; !strings.HasSuffix(pair[i].Device, "-sized") || got.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("sized-pair request %s: device %s consumes %s, want a sized device and %s", pair[i].Request, pair[i].Device, got.String(), want)
		}
	}
	results["sized-pair"] = pair
	waitAllocated(t, ctx, c, "one-shared")

	dirs := newPluginDirs(t)
	kubelet, _ := startPluginWith(t, env, dirs, &st)
	gpu := func(device string) (uuid, oversub string) {
		var i int
		_, _ = fmt.Sscanf(gpuIndexOf(device), "%d", &i)
		if i == 3 || i == 5 {
			return st.GPUs[i].UUID, "1"
		}
		return st.GPUs[i].UUID, "0"
	}
	const sched = "/var/run/gpusharing/scheduler/"
	for name, limits := range map[string][2]string{"two-shared": {}, "sized-pair": {"4294967296", "10737418240"}} {
		ref := claimRef(t, ctx, c, name)
		resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			t.Fatal(err)
		}
		got := resp.Claims[ref.Uid]
		if got == nil || got.Error != "" || len(got.Devices) != 2 || len(got.Devices[0].CdiDeviceIds) != 1 {
			t.Fatalf("claim %s: %+v; want two devices, the first with the set's CDI device", name, got)
		}
		envs, mounts := container(t, dirs.cdi, got.Devices[0].CdiDeviceIds[0])
		a, ovA := gpu(results[name][0].Device)
		b, ovB := gpu(results[name][1].Device)
		want := []string{
			"CUDA_VISIBLE_DEVICES=" + a + "," + b,
			"GPUSHARE_GPU_UUID=" + a + "," + b,
			"GPUSHARE_SOCKET=" + a + "=" + sched + a + "/gpushare.sock," + b + "=" + sched + b + "/gpushare.sock",
			"GPUSHARE_OVERSUB=" + a + "=" + ovA + "," + b + "=" + ovB,
			"LD_PRELOAD=/usr/lib/gpusharing/libgpushare.so",
			"NVIDIA_VISIBLE_DEVICES=" + a + "," + b,
		}
		if limits[0] != "" {
			want = append(want, "GPUSHARE_MEMORY_LIMIT_BYTES="+a+"="+limits[0]+","+b+"="+limits[1])
		}
		slices.Sort(want)
		slices.Sort(envs)
		if !reflect.DeepEqual(envs, want) {
			t.Errorf("claim %s: env\n got %v\nwant %v", name, envs, want)
		}
		wantMounts := []string{"/run/gpusharing/scheduler/" + a + ":" + sched + a + ":ro", "/run/gpusharing/scheduler/" + b + ":" + sched + b + ":ro",
			"/var/lib/gpusharing/lib/libgpushare.so:/usr/lib/gpusharing/libgpushare.so:ro"}
		slices.Sort(wantMounts)
		if !reflect.DeepEqual(mounts, wantMounts) {
			t.Errorf("claim %s: mounts\n got %v\nwant %v", name, mounts, wantMounts)
		}
	}
	ref := claimRef(t, ctx, c, "one-shared")
	resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil || resp.Claims[ref.Uid] == nil || resp.Claims[ref.Uid].Error != "" || len(resp.Claims[ref.Uid].Devices) != 1 {
		t.Fatalf("one shim share: %+v, %v", resp, err)
	}
	envs, _ := container(t, dirs.cdi, resp.Claims[ref.Uid].Devices[0].CdiDeviceIds[0])
	if !slices.Contains(envs, "GPUSHARE_SOCKET="+sched+"gpushare.sock") {
		t.Errorf("one shim share: env %v; want the single form's socket", envs)
	}
}
