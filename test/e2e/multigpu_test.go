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

// testMultiGPU asks for two shim shares, once through the device plugin (gpusharing.io/gpu-shared: 2)
// and once through a ResourceClaim for two devices on distinct GPUs (distinctAttribute on the GPU's
// uuid), and checks from each container's own output that it got two distinct shim GPUs (6 and 7),
// each GPU's scheduler socket and mount keyed by its uuid (docs/deviceplugin.md), and that the GPUNode
// lists the pod among the consumers of both GPUs.
func testMultiGPU(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	gpus, _ := gpuUUIDs(t)
	shimGPUs := []string{gpus[6], gpus[7]}

	pod := sharePod("two-shim", "gpusharing.io/gpu-shared", 2, nil)
	declareUse(pod)
	must(t, k8s.Create(ctx, pod))
	checkTwoShimGPUs(t, "two-shim", shimGPUs)
	kubectl(t, "-n", Namespace, "delete", "pod", "two-shim", "--wait=true", "--timeout=60s")

	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "two-shim-claim", Namespace: Namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: "gpusharing-shared", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2}}},
			Constraints: []resourcev1.DeviceConstraint{{DistinctAttribute: ptr(resourcev1.FullyQualifiedName("gpu.gpusharing.io/uuid"))}},
		}},
	}
	must(t, k8s.Create(ctx, claim))
	pod = sharePod("dra-two-shim", "", 0, nil)
	declareUse(pod)
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("two-shim-claim")}}
	must(t, k8s.Create(ctx, pod))
	checkTwoShimGPUs(t, "dra-two-shim", shimGPUs)
	must(t, k8s.Get(ctx, client.ObjectKeyFromObject(claim), claim))
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 2 {
		t.Errorf("claim two-shim-claim allocation %+v, want two devices", a)
	}
	kubectl(t, "-n", Namespace, "delete", "pod", "dra-two-shim", "--wait=true", "--timeout=60s")
	kubectl(t, "-n", Namespace, "delete", "resourceclaim", "two-shim-claim", "--wait=true", "--timeout=60s")
}

// declareUse makes the pod's processes use multiGPUMemoryMiB on every simulated GPU they see.
func declareUse(pod *corev1.Pod) {
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env,
		corev1.EnvVar{Name: nvmlmock.EnvSimulatedMemoryMiB, Value: strconv.Itoa(multiGPUMemoryMiB)})
}

// checkTwoShimGPUs checks a running pod's report and the GPUNode's consumers for two shim GPUs of allowed.
func checkTwoShimGPUs(t *testing.T, pod string, allowed []string) {
	t.Helper()
	r := readReport(t, pod)
	visible := strings.Split(r.env["CUDA_VISIBLE_DEVICES"], ",")
	if len(visible) != 2 || visible[0] == visible[1] || !slices.Contains(allowed, visible[0]) || !slices.Contains(allowed, visible[1]) {
		t.Fatalf("%s: CUDA_VISIBLE_DEVICES=%q, want two distinct GPUs of %v", pod, r.env["CUDA_VISIBLE_DEVICES"], allowed)
	}
	a, b := visible[0], visible[1]
	sock := func(g string) string { return g + "=/var/run/gpusharing/scheduler/" + g + "/gpushare.sock" }
	for k, v := range map[string]string{
		"NVIDIA_VISIBLE_DEVICES": a + "," + b,
		"LD_PRELOAD":             "/usr/lib/gpusharing/libgpushare.so",
		"GPUSHARE_GPU_UUID":      a + "," + b,
		"GPUSHARE_SOCKET":        sock(a) + "," + sock(b),
		"GPUSHARE_OVERSUB":       a + "=1," + b + "=1",
	} {
		if r.env[k] != v {
			t.Errorf("%s: %s=%q, want %q", pod, k, r.env[k], v)
		}
	}
	for _, g := range visible {
		if opts, ok := r.mounts["/var/run/gpusharing/scheduler/"+g]; !ok || !strings.HasPrefix(opts, "ro") {
			t.Errorf("%s: GPU %s's scheduler directory mounted %q (present %v), want read-only", pod, g, opts, ok)
		}
	}
	eventually(t, time.Minute, pod+" listed on both its GPUs", func(ctx context.Context) error {
		return consumerOnGPUs(ctx, pod, int64(multiGPUMemoryMiB)<<20, visible)
	})
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
