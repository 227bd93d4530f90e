package app

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/vacate"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
)

// startBothNode starts an agent with two GPUs serving the device plugin and DRA at once, as the chart's
// Both installs it (classes without extendedResourceName: the device plugin advertises every name), with
// GPU 0 exclusive and GPU 1 time-sliced in two, and returns it with its kubelet plugin's directories.
func startBothNode(t *testing.T) (*testNode, dra.PluginConfig) {
	t.Helper()
	plugin := dra.PluginConfig{}
	n := startNodeWith(t, 2, func(o *Options) {
		o.ResourceSlices = true
		root := filepath.Dir(o.MPSRoot)
		plugin = dra.PluginConfig{PluginDir: filepath.Join(root, "p"), RegistryDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi")}
		o.DRAPlugin = &plugin
	})
	if err := env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		t.Fatal(err)
	}
	n.setSpec(t, v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: exclusive()},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: timeSlicing(2)})
	n.waitFor(t, "both GPUs applied", appliedAsDesired(n.uuid(0), n.uuid(1)))
	waitSlices(t, n.name, "gpu-0 gpu-1-timeslicing-0 gpu-1-timeslicing-1")
	n.waitDevices(t, "GPU 0 advertised whole", "nvidia.com/gpu", map[string]string{n.uuid(0): "Healthy"})
	n.waitDevices(t, "GPU 1's replicas advertised", "gpusharing.io/gpu-timeslice", replicas(n.uuid(1), 2, nil))
	return n, plugin
}

// allocatedClaim creates a claim allocated device of n's pool and reserved for a running pod, as the
// scheduler writes it.
func allocatedClaim(t *testing.T, n *testNode, name, device string) *resourcev1.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	pod := runningPod(t, name+"-pod", nil)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-exclusive"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: n.name, Device: device}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	return claim
}

// prepareOnce is one NodePrepareResources of claim: its error, "" when prepared.
func prepareOnce(t *testing.T, kubelet drapb.DRAPluginClient, claim *resourcev1.ResourceClaim) string {
	t.Helper()
	ref := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	resp, err := kubelet.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Claims[string(claim.UID)]
	if got == nil {
		t.Fatalf("prepare of %s answered nothing for it", claim.Name)
	}
	return got.Error
}

func unprepare(t *testing.T, kubelet drapb.DRAPluginClient, claim *resourcev1.ResourceClaim) {
	t.Helper()
	ref := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	resp, err := kubelet.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil || resp.Claims[string(claim.UID)].GetError() != "" {
		t.Fatalf("unprepare of %s: %v %v", claim.Name, resp, err)
	}
}

// Where the device plugin and DRA serve one node, a GPU goes to whichever holds it first: a device plugin
// pod on GPU 0 takes GPU 0 out of the ResourceSlices and makes a claim on GPU 0 (allocated before) wait,
// with an error naming the pod, until the pod is gone; the prepared claim then makes GPU 0 Unhealthy in
// the device plugin.
func TestBesideTheDevicePluginAClaimWaitsForThePodHoldingItsGPU(t *testing.T) {
	n, plugin := startBothNode(t)
	kubelet := pluginClient(t, plugin.PluginDir)
	n.pods.SetPods(fakekubelet.Pod("web", "dp-pod", "nvidia.com/gpu", n.uuid(0)))
	waitSlices(t, n.name, "gpu-1-timeslicing-0 gpu-1-timeslicing-1")
	claim := allocatedClaim(t, n, "whole", "gpu-0")

	msg := prepareOnce(t, kubelet, claim)
	if !strings.Contains(msg, "device plugin pod web/dp-pod") || !strings.Contains(msg, "waits") {
		t.Fatalf("prepare of a claim on the GPU a device plugin pod holds: %q, want an error naming web/dp-pod and that the claim waits", msg)
	}
	n.waitDevices(t, "GPU 0 still Healthy for the device plugin", "nvidia.com/gpu", map[string]string{n.uuid(0): "Healthy"})

	n.pods.RemovePod("web", "dp-pod")
	waitSlices(t, n.name, "gpu-0 gpu-1-timeslicing-0 gpu-1-timeslicing-1")
	if msg := prepareOnce(t, kubelet, claim); msg != "" {
		t.Fatalf("prepare once the device plugin pod is gone: %s", msg)
	}
	n.waitDevices(t, "GPU 0 Unhealthy while the claim holds it", "nvidia.com/gpu", map[string]string{n.uuid(0): "Unhealthy"})
	n.waitDevices(t, "GPU 1 untouched", "gpusharing.io/gpu-timeslice", replicas(n.uuid(1), 2, nil))
}

// A prepared claim on one replica of GPU 1 makes every device plugin replica of GPU 1 Unhealthy and
// Allocate of one refused with an error naming the claim; after the unprepare they are Healthy and
// allocated again.
func TestBesideDRAAPreparedClaimTakesItsGPUFromTheDevicePlugin(t *testing.T) {
	n, plugin := startBothNode(t)
	kubelet := pluginClient(t, plugin.PluginDir)
	claim := allocatedClaim(t, n, "slice", "gpu-1-timeslicing-0")
	if msg := prepareOnce(t, kubelet, claim); msg != "" {
		t.Fatalf("prepare: %s", msg)
	}
	n.waitDevices(t, "GPU 1's replicas Unhealthy", "gpusharing.io/gpu-timeslice",
		map[string]string{share.ReplicaID(n.uuid(1), 0): "Unhealthy", share.ReplicaID(n.uuid(1), 1): "Unhealthy"})
	dp, err := n.kubelet.Dial("gpusharing.io/gpu-timeslice")
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	ctx := context.Background()
	_, err = dp.AllocateOne(ctx, share.ReplicaID(n.uuid(1), 1))
	if err == nil || !strings.Contains(err.Error(), "ResourceClaim "+claim.Namespace+"/slice") {
		t.Fatalf("Allocate of a replica of the claimed GPU: %v, want an error naming the claim", err)
	}

	unprepare(t, kubelet, claim)
	n.waitDevices(t, "GPU 1's replicas Healthy after the unprepare", "gpusharing.io/gpu-timeslice", replicas(n.uuid(1), 2, nil))
	if _, err := dp.AllocateOne(ctx, share.ReplicaID(n.uuid(1), 1)); err != nil {
		t.Fatalf("Allocate after the unprepare: %v", err)
	}
	// That allocation holds GPU 1 before the kubelet's PodResources shows its pod: the slices leave GPU 1
	// out, and a claim allocated there before waits.
	waitSlices(t, n.name, "gpu-0")
	again := allocatedClaim(t, n, "slice-again", "gpu-1-timeslicing-0")
	if msg := prepareOnce(t, kubelet, again); !strings.Contains(msg, "admitting") {
		t.Errorf("prepare right after an Allocate on the GPU: %q, want it refused for the allocation in flight", msg)
	}
}

// An Allocate and a prepare racing for GPU 0 give it to exactly one of them.
func TestBothInterfacesRacingForOneGPUGiveItToExactlyOne(t *testing.T) {
	n, plugin := startBothNode(t)
	kubelet := pluginClient(t, plugin.PluginDir)
	dp, err := n.kubelet.Dial("nvidia.com/gpu")
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	claim := allocatedClaim(t, n, "race", "gpu-0")
	var wg sync.WaitGroup
	var allocErr error
	var prepMsg string
	start := make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); <-start; _, allocErr = dp.AllocateOne(context.Background(), n.uuid(0)) }()
	go func() { defer wg.Done(); <-start; prepMsg = prepareOnce(t, kubelet, claim) }()
	close(start)
	wg.Wait()
	if (allocErr == nil) == (prepMsg == "") {
		t.Fatalf("Allocate: %v; prepare: %q; want exactly one of them to get GPU 0", allocErr, prepMsg)
	}
	// The loser lost to the winner, not to anything else.
	if allocErr != nil && !strings.Contains(allocErr.Error(), "ResourceClaim "+claim.Namespace+"/race") {
		t.Errorf("Allocate lost with %v, want it refused for the claim", allocErr)
	}
	if prepMsg != "" && !strings.Contains(prepMsg, "admitting through the device plugin") {
		t.Errorf("prepare lost with %q, want it refused for the allocation in flight", prepMsg)
	}
}

// After a restart the picture is the same: the checkpoint's claims hold their GPUs against Allocate, and
// the kubelet's PodResources is read again before a claim is prepared.
func TestARestartedAgentKeepsWhichInterfaceHoldsEachGPU(t *testing.T) {
	n, plugin := startBothNode(t)
	kubelet := pluginClient(t, plugin.PluginDir)
	claim := allocatedClaim(t, n, "kept", "gpu-1-timeslicing-1")
	if msg := prepareOnce(t, kubelet, claim); msg != "" {
		t.Fatalf("prepare: %s", msg)
	}
	n.pods.SetPods(fakekubelet.Pod("web", "dp-pod", "nvidia.com/gpu", n.uuid(0)))

	// What Setup builds on a restart, from the same checkpoint and kubelet, before either side serves.
	lister, closeLister, err := vacate.DialPodResources(n.pods.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeLister() }()
	owners := owner.New(lister, 0, nil)
	restarted, err := dra.NewKubeletPlugin(n.name, plugin, share.Config{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	restarted.SetOwners(owners)
	if err := owners.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !owners.HeldByDevicePlugin(n.uuid(0)) || owners.HeldByDevicePlugin(n.uuid(1)) {
		t.Errorf("after a restart the slices would leave out GPU 0 %v (want true) and GPU 1 %v (want false)",
			owners.HeldByDevicePlugin(n.uuid(0)), owners.HeldByDevicePlugin(n.uuid(1)))
	}
	if err := owners.TakeForDevicePlugin([]string{n.uuid(1)}); err == nil || !strings.Contains(err.Error(), claim.Namespace+"/kept") {
		t.Errorf("Allocate on GPU 1 after a restart: %v, want it refused for the checkpoint's claim", err)
	}
	err = owners.TakeForClaim(context.Background(), owner.Claim{UID: "other", Namespace: "ml", Name: "other", Units: []string{n.uuid(0)}})
	if err == nil || !strings.Contains(err.Error(), "web/dp-pod") {
		t.Errorf("claim on GPU 0 after a restart: %v, want it refused for the device plugin pod", err)
	}
	if err := owners.TakeForDevicePlugin([]string{n.uuid(0)}); err != nil {
		t.Errorf("Allocate on GPU 0, which no claim holds: %v", err)
	}
}
