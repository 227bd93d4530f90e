//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// multiGPUMemoryMiB is what each two-GPU pod declares it uses on each of its simulated GPUs.
const multiGPUMemoryMiB = 768

// testMultiGPU asks for two time-sliced shares (no shim), once through the device plugin
// (gpusharing.io/gpu-timeslice: 2) and once through a ResourceClaim for two devices on distinct GPUs
// (distinctAttribute on the GPU's uuid), and checks from each container's own output that it got both
// time-sliced GPUs (4 and 5) and no shim, and that the GPUNode lists the pod among the consumers of
// both. Then it asks for two shim shares the same two ways and checks from each container's own output
// that it got both shim GPUs (6 and 7) in the shim's list form (docs/multigpu.md): GPUSHARE_GPU_UUID
// lists them in CUDA_VISIBLE_DEVICES order, GPUSHARE_SOCKET and GPUSHARE_OVERSUB name each one's socket
// and swapping, and each GPU's scheduler socket directory is mounted read-only under its uuid with the
// socket reachable there.
func testMultiGPU(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	gpus, _ := gpuUUIDs(t)
	timeSliced := []string{gpus[4], gpus[5]}

	pod := sharePod("two-timeslice", "gpusharing.io/gpu-timeslice", 2, nil)
	declareUse(pod)
	must(t, k8s.Create(ctx, pod))
	checkTwoGPUs(t, "two-timeslice", timeSliced)
	kubectl(t, "-n", Namespace, "delete", "pod", "two-timeslice", "--wait=true", "--timeout=60s")

	claim := twoOnDistinctGPUs("two-timeslice-claim", "gpusharing-timeslicing")
	must(t, k8s.Create(ctx, claim))
	pod = claimPod("dra-two-timeslice", claim.Name)
	declareUse(pod)
	must(t, k8s.Create(ctx, pod))
	checkTwoGPUs(t, "dra-two-timeslice", timeSliced)
	must(t, k8s.Get(ctx, client.ObjectKeyFromObject(claim), claim))
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 2 {
		t.Errorf("claim %s allocation %+v, want two devices", claim.Name, a)
	}
	kubectl(t, "-n", Namespace, "delete", "pod/dra-two-timeslice", "resourceclaim/"+claim.Name, "--wait=true", "--timeout=60s")

	shimGPUs := []string{gpus[6], gpus[7]}
	pod = withListSocketProbes(t, sharePod("two-shim", "gpusharing.io/gpu-shared", 2, nil))
	must(t, k8s.Create(ctx, pod))
	checkTwoShimGPUs(t, "two-shim", shimGPUs)
	kubectl(t, "-n", Namespace, "delete", "pod", "two-shim", "--wait=true", "--timeout=60s")

	claim = twoOnDistinctGPUs("two-shim-claim", "gpusharing-shared")
	must(t, k8s.Create(ctx, claim))
	must(t, k8s.Create(ctx, withListSocketProbes(t, claimPod("dra-two-shim", claim.Name))))
	checkTwoShimGPUs(t, "dra-two-shim", shimGPUs)
	kubectl(t, "-n", Namespace, "delete", "pod/dra-two-shim", "resourceclaim/"+claim.Name, "--wait=true", "--timeout=60s")
}

// listSocketProbes reports, for each <uuid>=<path> of a list-form GPUSHARE_SOCKET, whether the path is
// a socket: "probe socket <uuid>=ok" (reportScript's own probe takes the variable as one path).
const listSocketProbes = `for kv in $(echo "$GPUSHARE_SOCKET" | tr ',' ' '); do [ -S "${kv#*=}" ] && echo "probe socket ${kv%%=*}=ok"; done
`

// withListSocketProbes makes the pod's report probe each socket of a list-form GPUSHARE_SOCKET.
func withListSocketProbes(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	const end = `echo "== end"`
	c := &pod.Spec.Containers[0]
	if len(c.Command) != 3 || !strings.Contains(c.Command[2], end) {
		t.Fatalf("%s: command %q is not reportScript's", pod.Name, c.Command)
	}
	c.Command[2] = strings.Replace(c.Command[2], end, listSocketProbes+end, 1)
	return pod
}

// checkTwoShimGPUs checks a running pod's report for shim shares of both GPUs of want in the list form,
// each GPU swapping (the e2e's shim GPUs have a memory budget) and none sized.
func checkTwoShimGPUs(t *testing.T, pod string, want []string) {
	t.Helper()
	r, visible := reportOnTwoGPUs(t, pod, want)
	const dir = "/var/run/gpusharing/scheduler/"
	a, b := visible[0], visible[1]
	for k, v := range map[string]string{
		"NVIDIA_VISIBLE_DEVICES": a + "," + b,
		"LD_PRELOAD":             "/usr/lib/gpusharing/libgpushare.so",
		"GPUSHARE_GPU_UUID":      a + "," + b,
		"GPUSHARE_SOCKET":        a + "=" + dir + a + "/gpushare.sock," + b + "=" + dir + b + "/gpushare.sock",
		"GPUSHARE_OVERSUB":       a + "=1," + b + "=1",
	} {
		if r.env[k] != v {
			t.Errorf("%s: %s=%q, want %q", pod, k, r.env[k], v)
		}
	}
	if v, ok := r.env["GPUSHARE_MEMORY_LIMIT_BYTES"]; ok {
		t.Errorf("%s: GPUSHARE_MEMORY_LIMIT_BYTES=%q, want none for fixed shares", pod, v)
	}
	for _, mp := range []string{"/usr/lib/gpusharing/libgpushare.so", dir + a, dir + b} {
		if opts, ok := r.mounts[mp]; !ok || !strings.HasPrefix(opts, "ro") {
			t.Errorf("%s: %s mounted %q (mounted: %v), want read-only", pod, mp, opts, ok)
		}
	}
	for _, u := range visible {
		if r.probes["socket "+u] != "ok" {
			t.Errorf("%s: probes %v, want GPU %s's scheduler socket reachable at its path in GPUSHARE_SOCKET", pod, r.probes, u)
		}
	}
}

// twoOnDistinctGPUs is a claim for two devices of class on distinct GPUs.
func twoOnDistinctGPUs(name, class string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2}}},
			Constraints: []resourcev1.DeviceConstraint{{DistinctAttribute: ptr(resourcev1.FullyQualifiedName("gpu.gpusharing.io/uuid"))}},
		}},
	}
}

// claimPod is a report pod whose container uses the named claim.
func claimPod(name, claim string) *corev1.Pod {
	pod := sharePod(name, "", 0, nil)
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr(claim)}}
	return pod
}

// declareUse makes the pod's processes use multiGPUMemoryMiB on every simulated GPU they see.
func declareUse(pod *corev1.Pod) {
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env,
		corev1.EnvVar{Name: nvmlmock.EnvSimulatedMemoryMiB, Value: strconv.Itoa(multiGPUMemoryMiB)})
}

// reportOnTwoGPUs reads a running pod's report and checks that CUDA_VISIBLE_DEVICES names both GPUs of
// want; it returns the report and the GPUs in CUDA_VISIBLE_DEVICES order.
func reportOnTwoGPUs(t *testing.T, pod string, want []string) (report, []string) {
	t.Helper()
	r := readReport(t, pod)
	visible := strings.Split(r.env["CUDA_VISIBLE_DEVICES"], ",")
	if len(visible) != 2 || visible[0] == visible[1] || !slices.Contains(want, visible[0]) || !slices.Contains(want, visible[1]) {
		t.Fatalf("%s: CUDA_VISIBLE_DEVICES=%q, want the two GPUs %v", pod, r.env["CUDA_VISIBLE_DEVICES"], want)
	}
	return r, visible
}

// checkTwoGPUs checks a running pod's report and the GPUNode's consumers for both GPUs of want, with no
// shim.
func checkTwoGPUs(t *testing.T, pod string, want []string) {
	t.Helper()
	r, visible := reportOnTwoGPUs(t, pod, want)
	if got := r.env["NVIDIA_VISIBLE_DEVICES"]; got != r.env["CUDA_VISIBLE_DEVICES"] {
		t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want %q", pod, got, r.env["CUDA_VISIBLE_DEVICES"])
	}
	for k, v := range r.env {
		if k == "LD_PRELOAD" || strings.HasPrefix(k, "GPUSHARE_") {
			t.Errorf("%s: %s=%q; want no shim on time-sliced shares", pod, k, v)
		}
	}
	eventually(t, time.Minute, pod+" listed on both its GPUs", func(ctx context.Context) error {
		return consumerOnGPUs(ctx, pod, int64(multiGPUMemoryMiB)<<20, visible)
	})
	checkPodGPUs(t, pod, int64(multiGPUMemoryMiB)<<20, visible)
}

// consumerOnGPUs says whether every GPU of uuids lists the pod among its consumers with memory bytes.
func consumerOnGPUs(ctx context.Context, pod string, memory int64, uuids []string) error {
	var gn v1alpha1.GPUNode
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
		return err
	}
	for _, g := range gn.Status.GPUs {
		if !slices.Contains(uuids, g.UUID) {
			continue
		}
		listed := false
		if g.Usage != nil {
			for _, c := range g.Usage.Consumers {
				listed = listed || (c.Namespace == Namespace && c.Pod == pod && c.Memory != nil && c.Memory.Value() == memory)
			}
		}
		if !listed {
			return fmt.Errorf("GPU %d (%s) does not list %s/%s with %d bytes: %+v", g.Index, g.UUID, Namespace, pod, memory, g.Usage)
		}
	}
	return nil
}
