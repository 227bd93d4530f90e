//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/devnodes/devnodestest"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// nodesScript prints the pod's environment and every NVIDIA character device in its /dev with its
// major and minor (hex, as stat prints them), then stays up.
const nodesScript = `echo "== env"; env | sort
echo "== nodes"
for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && echo "$f $(stat -c '%t %T' "$f")"; done
echo "== end"
exec sleep 3600`

// testDeviceNodes runs pods under the RuntimeClass nvidia, whose handler is NVIDIA's container runtime in
// CDI mode with accept-nvidia-visible-devices-envvar-when-unprivileged = false over the node's stand-in
// GPUs, each pod setting NVIDIA_VISIBLE_DEVICES=all itself: a device plugin share and a DRA claim each
// see only their GPU's node and the control and unified memory nodes (what the agent hands out as CDI
// devices and device specs), and a pod without a share sees no NVIDIA node. Without the hardened setting
// (E2E_NVIDIA_ACCEPT_ENVVAR=1) the runtime would give each of them every GPU of the Operator's spec.
// The agent pod runs without the host's IPC namespace.
func testDeviceNodes(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	checkAgentPod(t)
	minors := gpuMinors(t)

	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "nodes-claim", Namespace: Namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-exclusive"},
		}}}},
	}
	plugin := nodesPod("nodes-plugin")
	plugin.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resourceQuantity(1)}
	dra := nodesPod("nodes-dra")
	dra.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	dra.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("nodes-claim")}}
	none := nodesPod("nodes-none")
	t.Cleanup(func() {
		for _, p := range []*corev1.Pod{plugin, dra, none} {
			_ = k8s.Delete(ctx, p)
		}
		_ = k8s.Delete(ctx, claim)
	})
	// The device plugin serves beside DRA here, and a GPU goes to the interface that holds it first
	// (docs/dra.md, "One GPU, one interface"): the claim is made once the device plugin pod holds its GPU
	// and the slices leave that GPU out, so the kube-scheduler allocates it another one. Made together,
	// the claim could be allocated the same GPU in the moment before the slices change, and would wait.
	must(t, k8s.Create(ctx, plugin))
	pluginEnv, _ := readNodes(t, "nodes-plugin")
	withheld := pluginEnv["CUDA_VISIBLE_DEVICES"]
	eventually(t, time.Minute, "the slices leave out the device plugin pod's GPU", func(ctx context.Context) error {
		published, err := publishedUUIDs(ctx)
		if err == nil && published[withheld] {
			err = fmt.Errorf("GPU %s is still published (%v)", withheld, published)
		}
		return err
	})
	must(t, k8s.Create(ctx, claim))
	for _, p := range []*corev1.Pod{dra, none} {
		must(t, k8s.Create(ctx, p))
	}
	control := []string{"/dev/nvidia-uvm " + hexNode(devnodestest.UVMMajor, 0), "/dev/nvidia-uvm-tools " + hexNode(devnodestest.UVMMajor, 1),
		"/dev/nvidiactl " + hexNode(195, 255)}
	for _, pod := range []string{"nodes-plugin", "nodes-dra"} {
		env, nodes := readNodes(t, pod)
		uuid := env["CUDA_VISIBLE_DEVICES"]
		minor, ok := minors[uuid]
		if !ok {
			t.Fatalf("%s: CUDA_VISIBLE_DEVICES=%q names no GPU of the node (%v)", pod, uuid, minors)
		}
		want := append([]string{fmt.Sprintf("/dev/nvidia%d %s", minor, hexNode(195, uint32(minor)))}, control...)
		slices.Sort(want)
		if !reflect.DeepEqual(nodes, want) {
			t.Errorf("%s (GPU %s): the container has the NVIDIA nodes\n%v\nwant only its GPU's and the control ones\n%v", pod, uuid, nodes, want)
		}
	}
	if _, nodes := readNodes(t, "nodes-none"); len(nodes) != 0 {
		t.Errorf("a pod without a share that sets NVIDIA_VISIBLE_DEVICES=all has the NVIDIA nodes %v, want none", nodes)
	}
}

// nodesPod is a pod under the RuntimeClass nvidia that asks for every GPU through NVIDIA_VISIBLE_DEVICES.
func nodesPod(name string) *corev1.Pod {
	pod := sharePod(name, "", 0, nil)
	pod.Spec.RuntimeClassName = ptr("nvidia")
	pod.Spec.Containers[0].Command = []string{"/bin/sh", "-c", nodesScript}
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	return pod
}

func hexNode(major, minor uint32) string { return fmt.Sprintf("%x %x", major, minor) }

// readNodes waits for the pod's output and returns its environment and its NVIDIA nodes, sorted.
func readNodes(t *testing.T, pod string) (map[string]string, []string) {
	t.Helper()
	var out string
	eventually(t, 90*time.Second, "pod "+pod+"'s device nodes", func(ctx context.Context) error {
		o, err := kubectlErr("-n", Namespace, "logs", pod)
		if err != nil || !strings.Contains(o, "== end") {
			return fmt.Errorf("%v: %s", err, o)
		}
		out = o
		return nil
	})
	env := map[string]string{}
	var nodes []string
	section := ""
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "== "):
			section = strings.TrimPrefix(line, "== ")
		case section == "env":
			if k, v, ok := strings.Cut(line, "="); ok {
				env[k] = v
			}
		case section == "nodes" && line != "":
			nodes = append(nodes, line)
		}
	}
	slices.Sort(nodes)
	t.Logf("%s: NVIDIA nodes %v", pod, nodes)
	return env, nodes
}

// gpuMinors maps the node's GPU uuids to the device node minors the agent reports.
func gpuMinors(t *testing.T) map[string]int32 {
	t.Helper()
	var gn v1alpha1.GPUNode
	must(t, k8s.Get(context.Background(), client.ObjectKey{Name: NodeName}, &gn))
	out := map[string]int32{}
	for _, g := range gn.Status.GPUs {
		if g.MinorNumber == nil {
			t.Fatalf("GPU %d reports no minorNumber", g.Index)
		}
		out[g.UUID] = *g.MinorNumber
	}
	return out
}

// checkAgentPod checks that the agent pod runs without the host's IPC namespace, with the runtime's
// default seccomp profile for the pod, and Ready.
func checkAgentPod(t *testing.T) {
	t.Helper()
	var pods corev1.PodList
	must(t, k8s.List(context.Background(), &pods, client.InNamespace("gpusharing-system"), client.MatchingLabels{"app.kubernetes.io/name": "gpusharing-agent"}))
	if len(pods.Items) != 1 {
		t.Fatalf("%d agent pods, want 1", len(pods.Items))
	}
	p := pods.Items[0]
	if p.Spec.HostIPC {
		t.Error("the agent pod shares the host's IPC namespace")
	}
	if sc := p.Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the agent pod's seccomp profile is %+v, want RuntimeDefault", p.Spec.SecurityContext)
	}
	if !isReady(p) {
		t.Errorf("the agent pod is not Ready: %+v", p.Status.Conditions)
	}
	t.Logf("agent pod %s: hostIPC %v, hostPID %v, restarts %s", p.Name, p.Spec.HostIPC, p.Spec.HostPID, restarts(p))
}

func restarts(p corev1.Pod) string {
	var out []string
	for _, s := range p.Status.ContainerStatuses {
		out = append(out, s.Name+"="+strconv.Itoa(int(s.RestartCount)))
	}
	return strings.Join(out, ",")
}

// testDeviceNodesShared runs after Sharing: a MIG instance's pod sees its parent GPU's node and the
// capability nodes of its GPU and compute instance (the minors the driver's mig-minors gives them), and
// an MPS share's pod its GPU's node, each beside the control nodes only, though each sets
// NVIDIA_VISIBLE_DEVICES=all.
func testDeviceNodesShared(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	mig := nodesPod("nodes-mig")
	mig.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/mig-1g.10gb": *resourceQuantity(1)}
	mps := nodesPod("nodes-mps")
	mps.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"gpusharing.io/gpu-mps": *resourceQuantity(1)}
	for _, p := range []*corev1.Pod{mig, mps} {
		must(t, k8s.Create(ctx, p))
	}
	t.Cleanup(func() {
		for _, p := range []*corev1.Pod{mig, mps} {
			_ = k8s.Delete(ctx, p)
		}
	})
	var gn v1alpha1.GPUNode
	must(t, k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn))
	control := []string{"/dev/nvidia-uvm " + hexNode(devnodestest.UVMMajor, 0), "/dev/nvidia-uvm-tools " + hexNode(devnodestest.UVMMajor, 1),
		"/dev/nvidiactl " + hexNode(195, 255)}
	gpuNode := func(minor int32) string { return fmt.Sprintf("/dev/nvidia%d %s", minor, hexNode(195, uint32(minor))) }
	capNode := func(minor, gi, ci int32) string {
		m := devnodestest.MIGMinor(int(minor), int(gi), int(ci))
		return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d %s", m, hexNode(devnodestest.CapsMajor, m))
	}
	for _, pod := range []string{"nodes-mig", "nodes-mps"} {
		env, nodes := readNodes(t, pod)
		uuid := env["CUDA_VISIBLE_DEVICES"]
		var want []string
		for _, g := range gn.Status.GPUs {
			if g.MinorNumber == nil || g.Applied == nil {
				continue
			}
			if g.UUID == uuid {
				want = append(want, gpuNode(*g.MinorNumber))
			}
			for _, in := range g.Applied.MIGInstances {
				if in.UUID == uuid {
					want = append(want, gpuNode(*g.MinorNumber), capNode(*g.MinorNumber, in.GPUInstanceID, -1),
						capNode(*g.MinorNumber, in.GPUInstanceID, in.ComputeInstanceID))
				}
			}
		}
		if len(want) == 0 {
			t.Fatalf("%s: CUDA_VISIBLE_DEVICES=%q names no GPU or MIG instance of the node", pod, uuid)
		}
		want = append(want, control...)
		slices.Sort(want)
		if !reflect.DeepEqual(nodes, want) {
			t.Errorf("%s (%s): the container has the NVIDIA nodes\n%v\nwant only its own and the control ones\n%v", pod, uuid, nodes, want)
		}
	}
}

// publishedUUIDs are the GPU (and MIG instance) uuids the agent's ResourceSlices of the node publish now.
func publishedUUIDs(ctx context.Context) (map[string]bool, error) {
	var l resourcev1.ResourceSliceList
	if err := k8s.List(ctx, &l); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, sl := range l.Items {
		if sl.Spec.Driver != "gpu.gpusharing.io" || sl.Spec.NodeName == nil || *sl.Spec.NodeName != NodeName {
			continue
		}
		for _, d := range sl.Spec.Devices {
			if a, ok := d.Attributes["uuid"]; ok && a.StringValue != nil {
				out[*a.StringValue] = true
			}
		}
	}
	return out, nil
}
