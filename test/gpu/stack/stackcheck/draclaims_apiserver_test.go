package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// The GPU machine has no kube-scheduler, so the sized scenario writes each claim's allocation by hand.
// Here, against the real kube-apiserver and kube-scheduler v1.36.3: the allocation written by hand for a
// claim is the one the scheduler writes for the same claim on the same published device (device, pool,
// consumedCapacity, node selector, a share id), the API server keeps it whole, and the agent's kubelet
// plugin, called over its socket, prepares it into a CDI spec whose edits carry the claim's size;
// unpreparing removes the spec.
func TestAHandWrittenSizedAllocationIsTheSchedulersAndThePluginPreparesIt(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	c := env.Client
	if _, err := env.ReadyNode(ctx, testNode); err != nil {
		t.Fatal(err)
	}
	if err := env.ApplyDeviceClasses(ctx); err != nil {
		t.Fatal(err)
	}
	status := sizedStatus(0)
	cfg := share.Config{MPSRoot: "/run/gpusharing/mps", SchedulerRoot: "/run/gpusharing/scheduler", ShimLibrary: "/var/lib/gpusharing/lib/libgpushare.so"}
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := dra.NewPublisher(dra.PublisherOptions{Node: testNode, Kube: kube, Shares: cfg, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopPublisher := context.WithCancel(ctx)
	published := make(chan error, 1)
	go func() { published <- pub.Start(pctx) }()
	t.Cleanup(func() { stopPublisher(); <-published })
	pub.Publish(dra.Devices(status, cfg))
	var dev sizedDevice
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		slices, err := nodeSlices(ctx, c, testNode)
		if err != nil {
			return false, err
		}
		var ok bool
		dev, ok, err = findSizedDevice(slices, testNode, 0)
		return ok, err
	}, "the sized device published")

	sched, err := env.StartScheduler(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Stop)
	q := resource.MustParse
	for _, tt := range []struct {
		name            string
		memory, compute resource.Quantity
	}{
		{"on-the-grid", q("8Gi"), q("25")},
		{"rounded-up", q("3500Mi"), q("50")},
	} {
		// The scheduler's: a pod not bound yet, for the scheduler to place, and its claim.
		_, want, err := claimPod(ctx, c, "", "sched-"+tt.name, tt.memory, tt.compute)
		if err != nil {
			t.Fatal(err)
		}
		wait.UntilState(t, 60*time.Second, func() (bool, string) {
			err := c.Get(ctx, client.ObjectKeyFromObject(want), want)
			return err == nil && want.Status.Allocation != nil, fmt.Sprintf("allocation %+v (%v)", want.Status.Allocation, err)
		}, "the scheduler's allocation of %s", want.Name)
		// By hand: the same claim on a pod bound to the node.
		pod, claim, err := claimPod(ctx, c, testNode, "hand-"+tt.name, tt.memory, tt.compute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := allocate(ctx, c, claim, pod, dev, testNode); err != nil {
			t.Fatalf("the API server refused the hand-written allocation: %v", err)
		}
		got := &resourcev1.ResourceClaim{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), got); err != nil {
			t.Fatal(err)
		}
		assertSameAllocation(t, got, want)
		if r := got.Status.ReservedFor; len(r) != 1 || r[0].Name != pod.Name || r[0].UID != pod.UID || r[0].Resource != "pods" {
			t.Errorf("%s reserved for %+v, want the pod", got.Name, r)
		}
	}

	// The plugin prepares the hand-written 8Gi/25% claim as the kubelet asks over its socket.
	dirs, err := os.MkdirTemp("", "sc") // short: a Unix socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dirs) })
	pcfg := dra.PluginConfig{PluginDir: filepath.Join(dirs, "p"), RegistryDir: filepath.Join(dirs, "r"), CDIDir: filepath.Join(dirs, "cdi")}
	plugin, err := dra.NewKubeletPlugin(testNode, pcfg, cfg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	plugin.Update(status)
	pctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	h, err := plugin.Start(pctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	kubelet, err := dialDRA(pcfg.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.close)
	claim := &resourcev1.ResourceClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: podNamespace, Name: "hand-on-the-grid"}, claim); err != nil {
		t.Fatal(err)
	}
	ids, err := kubelet.prepare(ctx, claim, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cdi, err := resolveCDI(pcfg.CDIDir, ids)
	if err != nil {
		t.Fatal(err)
	}
	uuid := status.GPUs[0].UUID
	for k, v := range map[string]string{
		share.EnvCUDAVisibleDevices: uuid, share.EnvMPSPinnedMemLimit: "0=8192M", share.EnvMPSActiveThreadPercent: "25",
		share.EnvShimMemoryLimit: "8589934592", share.EnvLDPreload: "/usr/lib/gpusharing/libgpushare.so", share.EnvMPSPipeDirectory: "/var/run/gpusharing/mps",
	} {
		if cdi.edits.env[k] != v {
			t.Errorf("CDI env %s=%q, want %q (all: %v)", k, cdi.edits.env[k], v, cdi.edits.env)
		}
	}
	if len(cdi.edits.mounts) != 3 || len(cdi.files) != 1 {
		t.Errorf("CDI mounts %+v from %v: want the pipe directory, /dev/shm and the shim, from one spec", cdi.edits.mounts, cdi.files)
	}
	if err := kubelet.unprepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cdi.files[0]); !os.IsNotExist(err) {
		t.Errorf("CDI spec %s after NodeUnprepareResources: %v", cdi.files[0], err)
	}

	if err := deleteClaimPods(ctx, c, []string{"hand-on-the-grid", "hand-rounded-up", "hand-on-the-grid"}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&corev1.Pod{}, &resourcev1.ResourceClaim{}} {
		if err := c.Get(ctx, client.ObjectKey{Namespace: podNamespace, Name: "hand-on-the-grid"}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T after deleteClaimPods: %v", obj, err)
		}
	}
}

// assertSameAllocation compares a hand-written allocation with the scheduler's: the same device of the
// same pool for the same request, the same consumedCapacity and node selector, each with a share id.
func assertSameAllocation(t *testing.T, got, want *resourcev1.ResourceClaim) {
	t.Helper()
	g, w := got.Status.Allocation, want.Status.Allocation
	if len(g.Devices.Results) != 1 || len(w.Devices.Results) != 1 {
		t.Fatalf("results: by hand %+v, scheduler %+v", g.Devices.Results, w.Devices.Results)
	}
	gr, wr := g.Devices.Results[0], w.Devices.Results[0]
	if gr.Request != wr.Request || gr.Driver != wr.Driver || gr.Pool != wr.Pool || gr.Device != wr.Device {
		t.Errorf("%s: by hand %s/%s/%s/%s, scheduler %s/%s/%s/%s", got.Name, gr.Request, gr.Driver, gr.Pool, gr.Device, wr.Request, wr.Driver, wr.Pool, wr.Device)
	}
	if gr.ShareID == nil || wr.ShareID == nil {
		t.Errorf("%s: share ids by hand %v, scheduler %v", got.Name, gr.ShareID, wr.ShareID)
	}
	if len(gr.ConsumedCapacity) != len(wr.ConsumedCapacity) {
		t.Errorf("%s: consumed by hand %v, scheduler %v", got.Name, gr.ConsumedCapacity, wr.ConsumedCapacity)
	}
	for name, v := range wr.ConsumedCapacity {
		if h, ok := gr.ConsumedCapacity[name]; !ok || h.Cmp(v) != 0 {
			t.Errorf("%s: consumed %s by hand %v, scheduler %v", got.Name, name, gr.ConsumedCapacity, wr.ConsumedCapacity)
		}
	}
	if !reflect.DeepEqual(g.NodeSelector, w.NodeSelector) {
		t.Errorf("%s: node selector by hand %+v, scheduler %+v", got.Name, g.NodeSelector, w.NodeSelector)
	}
}
