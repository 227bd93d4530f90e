//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const dynMIGGPU = 4

// testDynamicMIG puts GPU 4 in MIG with instances created for claims (testdata/dynmig-policy.yaml): a
// pod's claim for a 2g.20gb is allocated a placement by the real kube-scheduler, the real kubelet calls
// the agent's plugin, which creates the instance there; the container sees that instance's MIG UUID,
// the GPUNode lists the instance with the claim and pod; deleting the pod and claim destroys it.
func testDynamicMIG(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	kubectl(t, "apply", "-f", "test/e2e/testdata/dynmig-policy.yaml")
	kubectl(t, "wait", "--for=condition=Ready", "gpusharingpolicy/e2e-dynmig", "--timeout=180s")
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "dynmig-claim", Namespace: Namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mig-dynamic", Selectors: []resourcev1.DeviceSelector{{
				CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.gpusharing.io"].migProfile == "2g.20gb"`}}}},
		}}}},
	}
	must(t, k8s.Create(ctx, claim))
	pod := sharePod("dynmig", "", 0, nil)
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("dynmig-claim")}}
	must(t, k8s.Create(ctx, pod))

	r := readReport(t, "dynmig")
	visible := r.env["NVIDIA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(visible, "MIG-") {
		t.Fatalf("dynmig: NVIDIA_VISIBLE_DEVICES=%q, want a MIG device", visible)
	}
	must(t, k8s.Get(ctx, client.ObjectKeyFromObject(claim), claim))
	eventually(t, time.Minute, "the GPUNode listing the instance with its claim and pod", func(ctx context.Context) error {
		in, err := dynInstance(ctx, claim.Name)
		if err != nil {
			return err
		}
		if in.UUID != visible || in.Profile != "2g.20gb" || string(in.Claim.UID) != string(claim.UID) || len(in.Claim.Pods) != 1 || in.Claim.Pods[0] != "dynmig" {
			return fmt.Errorf("instance %+v claim %+v; want %s, 2g.20gb, pod dynmig", in, in.Claim, visible)
		}
		return nil
	})

	kubectl(t, "-n", Namespace, "delete", "pod/dynmig", "resourceclaim/dynmig-claim", "--wait=true", "--timeout=60s")
	eventually(t, time.Minute, "the instance destroyed", func(ctx context.Context) error {
		if in, err := dynInstance(ctx, claim.Name); err == nil {
			return fmt.Errorf("GPU %d still lists %+v", dynMIGGPU, in)
		}
		return nil
	})
	// Time-slicing needs MIG mode off, which the agent turns off only for Exclusive: through it, then back.
	kubectl(t, "patch", "gpusharingpolicy/e2e-dynmig", "--type=merge", "-p", `{"spec":{"sharing":{"strategy":"Exclusive","mig":null}}}`)
	eventually(t, 3*time.Minute, "GPU 4 out of MIG mode", func(ctx context.Context) error {
		var gn v1alpha1.GPUNode
		if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
			return err
		}
		for _, g := range gn.Status.GPUs {
			if g.Index == dynMIGGPU && g.Applied != nil && g.Applied.Strategy == v1alpha1.StrategyExclusive {
				return nil
			}
		}
		return fmt.Errorf("GPU %d not Exclusive yet", dynMIGGPU)
	})
	kubectl(t, "delete", "-f", "test/e2e/testdata/dynmig-policy.yaml", "--wait=true", "--timeout=60s")
	eventually(t, 3*time.Minute, "GPU 4 time-sliced again", func(ctx context.Context) error {
		return allocatableIs(ctx, wantAllocatable)
	})
}

// dynInstance finds the instance GPU 4 lists for the claim.
func dynInstance(ctx context.Context, claim string) (v1alpha1.MIGInstanceStatus, error) {
	var gn v1alpha1.GPUNode
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
		return v1alpha1.MIGInstanceStatus{}, err
	}
	for _, g := range gn.Status.GPUs {
		if g.Index != dynMIGGPU || g.Applied == nil {
			continue
		}
		for _, in := range g.Applied.MIGInstances {
			if in.Claim != nil && in.Claim.Namespace == Namespace && in.Claim.Name == claim {
				return in, nil
			}
		}
	}
	return v1alpha1.MIGInstanceStatus{}, fmt.Errorf("GPU %d lists no instance of claim %s", dynMIGGPU, claim)
}
