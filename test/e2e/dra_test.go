//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// testDRA asks for an MPS share through a ResourceClaim instead of an extended resource: the real
// kube-scheduler allocates a device from the agent's ResourceSlices, the real kubelet calls the agent's DRA
// kubelet plugin, containerd applies the CDI spec it wrote, and the container sees what the device plugin's
// Allocate would have given it (checked from its own output). Deleting the pod and the claim removes the
// spec (NodeUnprepareResources).
func testDRA(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	gpus, _ := gpuUUIDs(t)
	eventually(t, 2*time.Minute, "the node's ResourceSlices", func(ctx context.Context) error {
		var l resourcev1.ResourceSliceList
		if err := k8s.List(ctx, &l); err != nil {
			return err
		}
		n := 0
		for _, s := range l.Items {
			if s.Spec.Driver == "gpu.gpusharing.io" && s.Spec.NodeName != nil && *s.Spec.NodeName == NodeName {
				n += len(s.Spec.Devices)
			}
		}
		if n == 0 {
			return fmt.Errorf("no device published for %s", NodeName)
		}
		return nil
	})
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "mps-claim", Namespace: Namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name:    "share",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mps"},
		}}}},
	}
	must(t, k8s.Create(ctx, claim))
	pod := sharePod("dra-mps", "", 0, nil)
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("mps-claim")}}
	must(t, k8s.Create(ctx, pod))

	r := readReport(t, "dra-mps")
	got := r.env["NVIDIA_VISIBLE_DEVICES"]
	if got != gpus[2] && got != gpus[3] {
		t.Errorf("dra-mps: NVIDIA_VISIBLE_DEVICES=%q, want an MPS GPU (%s or %s)", got, gpus[2], gpus[3])
	}
	for k, v := range map[string]string{"CUDA_VISIBLE_DEVICES": got, "CUDA_MPS_PIPE_DIRECTORY": "/var/run/gpusharing/mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=18432M"} {
		if r.env[k] != v {
			t.Errorf("dra-mps: %s=%q, want %q (what Allocate gives)", k, r.env[k], v)
		}
	}
	for _, mp := range []string{"/var/run/gpusharing/mps", "/dev/shm"} {
		if _, ok := r.mounts[mp]; !ok {
			t.Errorf("dra-mps: %s not mounted", mp)
		}
	}
	if shm := r.probes["shm"]; !strings.HasPrefix(shm, "tmpfs gpusharing-mps-shm ") {
		t.Errorf("dra-mps: /dev/shm is %q, want its GPU's tmpfs (gpusharing-mps-shm)", shm)
	}
	must(t, k8s.Get(ctx, client.ObjectKeyFromObject(claim), claim))
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 || claim.Status.Allocation.Devices.Results[0].Driver != "gpu.gpusharing.io" {
		t.Errorf("claim allocation %+v, want one device of gpu.gpusharing.io", claim.Status.Allocation)
	}
	spec := fmt.Sprintf("/run/cdi/gpusharing.io-claim_%s.json", claim.UID)
	if m, _ := filepath.Glob(spec); len(m) != 1 {
		t.Errorf("no CDI spec %s while the pod runs", spec)
	}
	kubectl(t, "-n", Namespace, "delete", "pod/dra-mps", "resourceclaim/mps-claim", "--wait=true", "--timeout=60s")
	eventually(t, time.Minute, "the claim's CDI spec removed", func(ctx context.Context) error {
		if m, _ := filepath.Glob(spec); len(m) != 0 {
			return fmt.Errorf("%s still there", spec)
		}
		return nil
	})
}
