//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// The sized claim of the Usage scenario, on GPU 5 sized per claim under MPS (testdata/sized-policy.yaml):
// 2 GiB and 20% of the SMs, held by a pod whose process declares 3 GiB to the simulated GPU, more than its
// claim, as a process that dropped its MPS limit would hold, so the claim alert has a pod to return.
const (
	sizedPod            = "usage-sized"
	sizedGPU            = 5
	sizedClaimMiB       = 2048
	sizedComputePercent = 20
	sizedUsedMiB        = 3072
	sizedSMPercent      = 10
)

// startSizedClaimPod sizes GPU 5 per claim and runs sizedPod with its claim, then checks what the claim
// gave it: the limits in its own environment (its report) and the claim in the GPUNode's status.
func startSizedClaimPod(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	kubectl(t, "apply", "-f", "test/e2e/testdata/sized-policy.yaml")
	kubectl(t, "wait", "--for=condition=Ready", "gpusharingpolicy/e2e-sized", "--timeout=180s")
	gpus, _ := gpuUUIDs(t)
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: sizedPod, Namespace: Namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized", Capacity: &resourcev1.CapacityRequirements{
				Requests: map[resourcev1.QualifiedName]resource.Quantity{
					dra.CapacityMemory:  *resource.NewQuantity(sizedClaimMiB<<20, resource.BinarySI),
					dra.CapacityCompute: *resource.NewQuantity(sizedComputePercent, resource.DecimalSI),
				},
			}},
		}}}},
	}
	must(t, k8s.Create(ctx, claim))
	pod := sharePod(sizedPod, "", 0, nil)
	pod.Spec.Containers[0].Env = []corev1.EnvVar{
		{Name: nvmlmock.EnvSimulatedMemoryMiB, Value: strconv.Itoa(sizedUsedMiB)},
		{Name: nvmlmock.EnvSimulatedSMPercent, Value: strconv.Itoa(sizedSMPercent)},
	}
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr(sizedPod)}}
	must(t, k8s.Create(ctx, pod))

	r := readReport(t, sizedPod)
	// The agent's default --context-reserve comes off an MPS client's limit: NVML counts the context.
	limitMiB := sizedClaimMiB - dra.DefaultContextReserve>>20
	for k, v := range map[string]string{
		"NVIDIA_VISIBLE_DEVICES":            gpus[sizedGPU],
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  fmt.Sprintf("0=%dM", limitMiB),
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": strconv.Itoa(sizedComputePercent),
		// The shim, with no scheduler socket, reports that limit as the GPU's memory.
		"LD_PRELOAD":                  "/usr/lib/gpusharing/libgpushare.so",
		"GPUSHARE_MEMORY_LIMIT_BYTES": strconv.Itoa(limitMiB << 20),
	} {
		if r.env[k] != v {
			t.Errorf("%s: %s=%q inside the container, want %q (its claim's size)", sizedPod, k, r.env[k], v)
		}
	}
	eventually(t, time.Minute, "the GPUNode listing the sized claim with what its pod uses", func(ctx context.Context) error {
		var gn v1alpha1.GPUNode
		if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
			return err
		}
		for _, g := range gn.Status.GPUs {
			if g.Index != sizedGPU || g.Sized == nil {
				continue
			}
			for _, c := range g.Sized.Claims {
				if c.Namespace != Namespace || c.Name != sizedPod {
					continue
				}
				if len(c.Pods) != 1 || c.Pods[0] != sizedPod || c.Memory == nil || c.Memory.Value() != sizedClaimMiB<<20 ||
					c.Compute != sizedComputePercent || c.MemoryUsed == nil || c.MemoryUsed.Value() != sizedUsedMiB<<20 {
					return fmt.Errorf("claim listed as %+v (memory %v, used %v)", c, c.Memory, c.MemoryUsed)
				}
				return nil
			}
			return fmt.Errorf("GPU %d sized %+v does not list the claim", g.Index, g.Sized)
		}
		return fmt.Errorf("GPU %d has no sized status", sizedGPU)
	})
}

// stopSizedClaimPod deletes the pod, its claim and the sized policy, and waits for GPU 5 to be
// time-sliced again (the kubelet's allocatable as after the Sharing scenario).
func stopSizedClaimPod(t *testing.T) {
	t.Helper()
	kubectl(t, "-n", Namespace, "delete", "pod/"+sizedPod, "resourceclaim/"+sizedPod, "--wait=true", "--timeout=60s")
	kubectl(t, "delete", "-f", "test/e2e/testdata/sized-policy.yaml", "--wait=true", "--timeout=60s")
	eventually(t, 3*time.Minute, "GPU 5 time-sliced again", func(ctx context.Context) error {
		return allocatableIs(ctx, wantAllocatable)
	})
}
