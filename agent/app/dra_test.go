package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/wait"
)

// slicedDevices lists the device names of node's ResourceSlices (each taint after its name, as
// [key=value:effect]) and their pool generation.
func slicedDevices(t *testing.T, node string) (string, int64, []metav1.OwnerReference) {
	t.Helper()
	var list resourcev1.ResourceSliceList
	if err := env.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	var gen int64
	var owners []metav1.OwnerReference
	for _, s := range list.Items {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Driver != dra.DriverName {
			continue
		}
		gen, owners = s.Spec.Pool.Generation, s.OwnerReferences
		for _, d := range s.Spec.Devices {
			name := d.Name
			for _, taint := range d.Taints {
				name += fmt.Sprintf("[%s=%s:%s]", taint.Key, taint.Value, taint.Effect)
			}
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return strings.Join(names, " "), gen, owners
}

func waitSlices(t *testing.T, node, want string) int64 {
	t.Helper()
	var gen int64
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		var got string
		got, gen, _ = slicedDevices(t, node)
		return got == want, fmt.Sprintf("slices list %q", got)
	}, "the ResourceSlices of %s list %q", node, want)
	return gen
}

func TestAgentPublishesItsAppliedSharingAsResourceSlices(t *testing.T) {
	n := startNodeWith(t, 2, func(o *Options) { o.ResourceSlices = true })
	// The slices are owned by the Node (nothing runs a kubelet here to register it).
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	if err := env.Client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: mpsSharing(2)},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: exclusive()},
	)
	gen := waitSlices(t, n.name, "gpu-0-mps-0 gpu-0-mps-1 gpu-1")
	if _, _, owners := slicedDevices(t, n.name); len(owners) != 1 || owners[0].Kind != "Node" || owners[0].UID != node.UID {
		t.Errorf("slice owners = %+v, want the Node", owners)
	}
	// A policy change is published: the pool's one slice is updated in place, a single write the
	// scheduler reads whole, so the pool keeps its generation.
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: n.uuid(0), Index: 0, Sharing: timeSlicing(3)},
		v1alpha1.GPUDesired{UUID: n.uuid(1), Index: 1, Sharing: exclusive()},
	)
	if gen2 := waitSlices(t, n.name, "gpu-0-timeslicing-0 gpu-0-timeslicing-1 gpu-0-timeslicing-2 gpu-1"); gen2 != gen {
		t.Errorf("pool generation %d after the change, was %d", gen2, gen)
	}
}

// A node that serves DRA only (no device plugin): a claim the scheduler gave an MPS share is prepared by
// the agent's kubelet plugin with the pipe directory of the MPS daemon the agent runs for the claim's
// namespace, and a disruptive change drains the GPU: its devices leave the slices, the status names the
// pod holding the claim, and the change is applied once the pod ends.
func TestDRAOnlyNodePreparesClaimsAndDrainsThePodsHoldingThem(t *testing.T) {
	ctx := context.Background()
	plugin := dra.PluginConfig{}
	n := startNodeWith(t, 1, func(o *Options) {
		o.DevicePlugin, o.PodResourcesSocket = nil, ""
		o.ResourceSlices = true
		plugin = dra.PluginConfig{PluginDir: filepath.Join(filepath.Dir(o.MPSRoot), "p"), RegistryDir: filepath.Join(filepath.Dir(o.MPSRoot), "r"),
			CDIDir: filepath.Join(filepath.Dir(o.MPSRoot), "cdi")}
		o.DRAPlugin = &plugin
	})
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		t.Fatal(err)
	}
	uuid := n.uuid(0)
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: mpsSharing(2)})
	waitSlices(t, n.name, "gpu-0-mps-0 gpu-0-mps-1")

	// The scheduler's work, written as it writes it: gpu-0-mps-0 allocated and reserved for the pod.
	pod := runningPod(t, "mps-client", nil)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "gpu"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mps"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: n.name, Device: "gpu-0-mps-0"}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(plugin.PluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Claims[string(claim.UID)]; got == nil || got.Error != "" || len(got.Devices) != 1 {
		t.Fatalf("prepare = %+v", got)
	}
	spec, err := cdiapi.ReadSpec(dra.CDISpecPath(plugin.CDIDir, claim.UID), 0)
	if err != nil {
		t.Fatal(err)
	}
	var hostPaths []string
	for _, m := range spec.Devices[0].ContainerEdits.Mounts {
		hostPaths = append(hostPaths, m.HostPath)
	}
	// The claim's namespace has a daemon of its own on the GPU, which the agent started for it.
	if pipe := filepath.Join(n.dir, "mps", uuid, "ns", claim.Namespace, "pipe"); !slices.Contains(hostPaths, pipe) {
		t.Errorf("the CDI spec mounts %v, not the MPS pipe directory of the claim's namespace %s", hostPaths, pipe)
	}
	if _, err := os.Stat(filepath.Join(n.dir, "mps", uuid, "ns", claim.Namespace, "pipe", mps.PIDFile)); err != nil {
		t.Errorf("no MPS daemon runs for the claim's namespace: %v", err)
	}

	podName := pod.Namespace + "/" + pod.Name
	// `kubectl get gpusharing -o wide` names the pod in its Claimed By column.
	n.waitFor(t, "status.claimedBy naming the pod of the prepared claim", func(g *v1alpha1.GPUNode) (bool, string) {
		return g.Status.ClaimedBy == "0:"+podName, fmt.Sprintf("claimedBy %q", g.Status.ClaimedBy)
	})
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: timeSlicing(2), Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute)})
	n.waitFor(t, "Draining naming the pod holding the claim", draining(uuid, podName, "waiting for 1 pods"))
	waitSlices(t, n.name, "")
	// A pass later the GPU is still draining: the pod holds its claim. (This drain finds the pods through
	// their claims in the API server, not the kubelet's PodResources: a pass is the event seen here.)
	n.reconciled(t)
	if reason, _, _ := applied(n.get(t), uuid); reason != v1alpha1.ReasonDraining {
		t.Fatalf("Applied reason %s while the pod holds its claim, want Draining", reason)
	}
	env.SetPodPhase(t, ctx, pod, corev1.PodSucceeded)
	n.waitFor(t, "time-slicing applied after the pod ended", appliedAsDesired(uuid))
	waitSlices(t, n.name, "gpu-0-timeslicing-0 gpu-0-timeslicing-1")
}

// Sizing per claim through the whole agent: the policy's sizing reaches the GPU's status once applied,
// the GPU becomes one sized device in the slices, the device plugin stops advertising its replicas and
// the status says why; going back to fixed shares restores both.
func TestAgentPublishesASizedGPUAsOneDeviceAndTheDevicePluginLeavesItOut(t *testing.T) {
	n := startNodeWith(t, 1, func(o *Options) { o.ResourceSlices = true })
	if err := env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		t.Fatal(err)
	}
	uuid := n.uuid(0)
	fixed := v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 2}}
	sized := *fixed.DeepCopy()
	sized.Sizing = &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim}
	devicePlugin := func(g *v1alpha1.GPUNode) string {
		st := gpuState(g, uuid)
		if st == nil {
			return "<no GPU>"
		}
		if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDevicePlugin); c != nil {
			return string(c.Status) + "/" + c.Reason
		}
		return "absent"
	}

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: fixed})
	waitSlices(t, n.name, "gpu-0-mps-0 gpu-0-mps-1")
	n.waitDevices(t, "fixed MPS replicas", "gpusharing.io/gpu-mps", replicas(uuid, 2, nil))

	// No pod holds the GPU, so the drain this disruptive change takes ends at once.
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: sized, Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute)})
	g := n.waitFor(t, "sized shares applied", func(g *v1alpha1.GPUNode) (bool, string) {
		ok, msg := appliedAsDesired(uuid)(g)
		return ok && devicePlugin(g) == "False/"+v1alpha1.ReasonSizedByClaim, msg + "; DevicePlugin " + devicePlugin(g)
	})
	if a := gpuState(g, uuid).Applied; !a.Sizing.PerClaim() || a.SpecHash != v1alpha1.SharingHash(sized) {
		t.Errorf("applied %+v: want sizing PerClaim under the sized sharing's hash", a)
	}
	// The daemon keeps the GPU's defaults (a client can only lower them): no thread percentage of
	// 100/replicas that would cap a claim asking for more.
	if m := gpuState(g, uuid).Applied.MPS; m == nil || m.ActiveThreadPercentage != 0 || m.PinnedMemoryLimit != nil {
		t.Errorf("the sized GPU's MPS daemon runs with %+v, want the GPU's defaults", m)
	}
	waitSlices(t, n.name, "gpu-0-sized")
	n.waitDevices(t, "no fixed replicas beside the sized device", "gpusharing.io/gpu-mps", nil)

	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: fixed, Drain: drainSpec(v1alpha1.DrainWaitForIdle, time.Minute)})
	n.waitFor(t, "fixed shares again", func(g *v1alpha1.GPUNode) (bool, string) {
		ok, msg := appliedAsDesired(uuid)(g)
		return ok && devicePlugin(g) == "absent" && !gpuState(g, uuid).Applied.Sizing.PerClaim(), msg + "; DevicePlugin " + devicePlugin(g)
	})
	waitSlices(t, n.name, "gpu-0-mps-0 gpu-0-mps-1")
	n.waitDevices(t, "fixed MPS replicas again", "gpusharing.io/gpu-mps", replicas(uuid, 2, nil))
}
