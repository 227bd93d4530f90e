//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// The Rightsizing scenario's workload: pods of 10Gi claims whose processes hold 3Gi of the simulated H100.
const (
	rsNamespace = "e2e-rightsizing"
	rsWorkload  = "infer"
	rsClaimMiB  = 10240
	rsUsedMiB   = 3072
	// rsPacked pods fit GPU 5 (about 79Gi for claims) at the recommended 3.5Gi, not at 10Gi (7 at most).
	rsPacked = 10
)

// testRightsizing runs a Deployment whose pods hold 3Gi of 10Gi claims on a GPU sized per claim, waits for
// its GPUShareRecommendation (3.5Gi: the pods' peak plus 10 %, rounded to the 512Mi step), then opts the
// namespace in to Initial: the claims of the pods made after are 3.5Gi, and the real kube-scheduler packs
// rsPacked of them onto the one sized GPU, where 10Gi claims would leave most of them Pending.
func testRightsizing(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	// The manager recommends after 3 pod peaks and 20 s here, not the default 10 minutes. It runs in the
	// host's network here, so the new pod cannot start beside the old one: Recreate while the test runs.
	kubectl(t, "-n", "gpusharing-system", "patch", "deployment", "gpusharing-manager", "--type=json", "-p",
		`[{"op":"replace","path":"/spec/strategy","value":{"type":"Recreate"}},`+
			`{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--rightsizing-min-history=20s"},`+
			`{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--rightsizing-sample-interval=2s"},`+
			`{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--rightsizing-write-interval=5s"}]`)
	t.Cleanup(func() {
		_, _ = kubectlErr("-n", "gpusharing-system", "rollout", "undo", "deployment/gpusharing-manager")
		_, _ = kubectlErr("-n", "gpusharing-system", "rollout", "status", "deployment/gpusharing-manager", "--timeout=120s")
		_, _ = kubectlErr("-n", "gpusharing-system", "patch", "deployment", "gpusharing-manager", "--type=merge", "-p",
			`{"spec":{"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":"25%","maxUnavailable":"25%"}}}}`)
		_, _ = kubectlErr("delete", "namespace", rsNamespace, "--wait=true", "--timeout=120s")
		_, _ = kubectlErr("delete", "-f", "test/e2e/testdata/rightsizing-policy.yaml", "--wait=true", "--timeout=60s")
	})
	kubectl(t, "-n", "gpusharing-system", "rollout", "status", "deployment/gpusharing-manager", "--timeout=120s")
	kubectl(t, "apply", "-f", "test/e2e/testdata/rightsizing-policy.yaml")
	kubectl(t, "wait", "--for=condition=Ready", "gpusharingpolicy/e2e-rightsizing", "--timeout=180s")
	kubectl(t, "create", "namespace", rsNamespace)

	must(t, k8s.Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: rsNamespace, Name: "gpu"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: "gpusharing-sized",
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					dra.CapacityMemory: *resource.NewQuantity(rsClaimMiB<<20, resource.BinarySI),
					// Asked, so ten claims fit the GPU's 100 % (the default is 100/replicas each).
					dra.CapacityCompute: *resource.NewQuantity(5, resource.DecimalSI)}},
			}}}}}},
	}))
	labels := map[string]string{"app": rsWorkload}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: rsNamespace, Name: rsWorkload},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(3)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr(int64(1)),
					Containers: []corev1.Container{{
						Name: "work", Image: BusyboxImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/bin/sh", "-c", "exec sleep 3600"},
						Env: []corev1.EnvVar{
							{Name: nvmlmock.EnvSimulatedMemoryMiB, Value: strconv.Itoa(rsUsedMiB)},
							{Name: nvmlmock.EnvSimulatedSMPercent, Value: "30"},
						},
						Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
					}},
					ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr("gpu")}},
				},
			},
		},
	}
	must(t, k8s.Create(ctx, d))
	kubectl(t, "-n", rsNamespace, "rollout", "status", "deployment/"+rsWorkload, "--timeout=180s")

	const name = "deployment-" + rsWorkload + "-gpu"
	eventually(t, 3*time.Minute, "a recommendation of 3.5Gi for pods holding 3Gi of 10Gi", func(ctx context.Context) error {
		var r v1alpha1.GPUShareRecommendation
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: rsNamespace, Name: name}, &r); err != nil {
			return err
		}
		if r.Status.InitialMemory == nil || r.Status.InitialMemory.String() != "3584Mi" || r.Status.Samples < 3 ||
			r.Status.ClaimMemory == nil || r.Status.ClaimMemory.Value() != rsClaimMiB<<20 {
			return fmt.Errorf("status %+v", r.Status)
		}
		return nil
	})
	t.Log(kubectl(t, "-n", rsNamespace, "get", "gpusharerecommendations"))

	// Each claim shows its pod's use in its own status, for its owner to read without node access.
	var shown string
	eventually(t, time.Minute, "a claim's device status with its pod's 3Gi", func(ctx context.Context) error {
		var claims resourcev1.ResourceClaimList
		if err := k8s.List(ctx, &claims, client.InNamespace(rsNamespace)); err != nil {
			return err
		}
		if len(claims.Items) == 0 {
			return fmt.Errorf("no claim in %s", rsNamespace)
		}
		for _, c := range claims.Items {
			if len(c.Status.Devices) != 1 || c.Status.Devices[0].Data == nil {
				return fmt.Errorf("claim %s status.devices %+v", c.Name, c.Status.Devices)
			}
			var u dra.DeviceUsage
			if err := json.Unmarshal(c.Status.Devices[0].Data.Raw, &u); err != nil {
				return err
			}
			if u.MemoryBytes != rsUsedMiB<<20 || u.PeakMemoryBytes != rsUsedMiB<<20 || len(u.Pods) != 1 {
				return fmt.Errorf("claim %s data %s", c.Name, c.Status.Devices[0].Data.Raw)
			}
			shown = c.Name
		}
		return nil
	})
	t.Log(kubectl(t, "-n", rsNamespace, "get", "resourceclaim", shown, "-o", "yaml"))

	// Opt in, and replace the pods: the new ones' claims get the recommendation at creation.
	kubectl(t, "label", "namespace", rsNamespace, v1alpha1.RightsizingModeKey+"=Initial")
	eventually(t, time.Minute, "the recommendation in mode Initial", func(ctx context.Context) error {
		var r v1alpha1.GPUShareRecommendation
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: rsNamespace, Name: name}, &r); err != nil {
			return err
		}
		if r.Status.Mode != v1alpha1.RightsizingInitial {
			return fmt.Errorf("mode %q", r.Status.Mode)
		}
		return nil
	})
	kubectl(t, "-n", rsNamespace, "delete", "pods", "-l", "app="+rsWorkload, "--wait=true", "--timeout=120s")
	kubectl(t, "-n", rsNamespace, "scale", "deployment/"+rsWorkload, "--replicas="+strconv.Itoa(rsPacked))
	kubectl(t, "-n", rsNamespace, "rollout", "status", "deployment/"+rsWorkload, "--timeout=240s")
	eventually(t, time.Minute, "every claim of the workload at 3.5Gi, allocated on GPU 5", func(ctx context.Context) error {
		var claims resourcev1.ResourceClaimList
		if err := k8s.List(ctx, &claims, client.InNamespace(rsNamespace)); err != nil {
			return err
		}
		n := 0
		for _, c := range claims.Items {
			if c.DeletionTimestamp != nil {
				continue
			}
			q := c.Spec.Devices.Requests[0].Exactly.Capacity.Requests[dra.CapacityMemory]
			if q.String() != "3584Mi" {
				return fmt.Errorf("claim %s asks %s", c.Name, q.String())
			}
			if c.Status.Allocation == nil {
				return fmt.Errorf("claim %s not allocated", c.Name)
			}
			n++
		}
		if n != rsPacked {
			return fmt.Errorf("%d claims, want %d", n, rsPacked)
		}
		return nil
	})
	t.Log(kubectl(t, "-n", rsNamespace, "get", "resourceclaims", "-o",
		"custom-columns=CLAIM:.metadata.name,MEMORY:.spec.devices.requests[0].exactly.capacity.requests.memory,DEVICE:.status.allocation.devices.results[0].device"))
}
