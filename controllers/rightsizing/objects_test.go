package rightsizing_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
)

const driver = "gpu.gpusharing.io"

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// namespace creates a namespace with the given labels and annotations.
func namespace(t *testing.T, suffix string, labels, annotations map[string]string) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.TrimRight(name, "-") + "-" + suffix
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}})
	return name
}

func ctrlRef(apiVersion, kind string, obj metav1.Object) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: obj.GetName(), UID: obj.GetUID(), Controller: ptr.To(true)}}
}

// deployment creates a Deployment and its ReplicaSet <name>-<hash>, as the apps controllers would, with
// the annotations on the Deployment.
func deployment(t *testing.T, ns, name, hash string, annotations map[string]string) *appsv1.ReplicaSet {
	t.Helper()
	labels := map[string]string{"app": name}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}
	create(t, d)
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-" + hash, OwnerReferences: ctrlRef("apps/v1", "Deployment", d)},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}
	create(t, rs)
	return rs
}

// pod creates a pod owned by owner (nil: a bare pod).
func pod(t *testing.T, ns, name string, owner []metav1.OwnerReference) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, OwnerReferences: owner},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	create(t, p)
	return p
}

// claimFor builds the claim the kube-controller-manager creates from a template for p: named
// <pod>-<podClaim>-<5 chars>, owned by the pod, annotated with the pod's claim name, asking memory.
func claimFor(p *corev1.Pod, podClaim, suffix, memory string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: fmt.Sprintf("%s-%s-%s", p.Name, podClaim, suffix),
			Annotations:     map[string]string{rightsizing.PodClaimNameAnnotation: podClaim},
			OwnerReferences: ctrlRef("v1", "Pod", p)},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.gpusharing.io",
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					"memory": resource.MustParse(memory)}}},
		}}}},
	}
}

// allocate writes an allocation of one device of the driver for the claim's request gpu.
func allocate(t *testing.T, c *resourcev1.ResourceClaim) {
	t.Helper()
	c.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: driver, Pool: "node", Device: "gpu-0"}}}}
	if err := env.Client.Status().Update(context.Background(), c); err != nil {
		t.Fatalf("allocating claim %s: %v", c.Name, err)
	}
}

// memoryOf is the memory the claim's request gpu asks.
func memoryOf(t *testing.T, c *resourcev1.ResourceClaim) string {
	t.Helper()
	q := c.Spec.Devices.Requests[0].Exactly.Capacity.Requests["memory"]
	return q.String()
}

// recommendation creates a GPUShareRecommendation as the manager would and writes its status.
func recommendation(t *testing.T, ns string, w v1.WorkloadRef, mode v1.RightsizingMode, initial string) {
	t.Helper()
	r := &v1.GPUShareRecommendation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: strings.ToLower(string(w.Kind)) + "-" + w.Name + "-gpu"},
		Spec: v1.GPUShareRecommendationSpec{Workload: w, PodClaim: "gpu", Request: "gpu"}}
	create(t, r)
	r.Status = v1.GPUShareRecommendationStatus{Mode: mode, InitialMemory: ptr.To(resource.MustParse(initial)),
		PodNamePattern: rightsizing.PodNamePattern(w)}
	if err := env.Client.Status().Update(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}
