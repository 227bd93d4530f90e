package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
)

// The right-sizing part: a Deployment whose pods hold 3Gi of 10Gi claims on the notebook pool's sized
// GPUs (simulated use, simnode's PodUsage), its recommendation, and the same Deployment after its
// namespace opts in to Initial, whose new pods' claims the admission policy sizes so the real
// kube-scheduler packs more of them onto one GPU.
const (
	rsNamespace = "team-a"
	rsWorkload  = "web"
	rsClaim     = "10Gi"
	rsUsedMiB   = 3072
	rsScaled    = 10
	rsRecName   = "deployment-" + rsWorkload + "-gpu"
	rsTimeout   = 3 * time.Minute
	// rsAdmissionPolicy is the MutatingAdmissionPolicy users apply (config/admission/rightsizing).
	rsAdmissionPolicy = "config/admission/rightsizing/rightsizing_policy.yaml"
)

// rightsizingOptions are the manager's right-sizing options in the demo: the defaults with intervals of
// seconds (samples every second, writes every two, a recommendation 10 s after the first sample), so the
// part takes seconds, not the production minutes.
func rightsizingOptions() *rightsizing.Options {
	o := rightsizing.DefaultOptions()
	o.SampleInterval, o.FlushInterval, o.CheckpointInterval = time.Second, 2*time.Second, 2*time.Second
	o.Config.MinHistory = 10 * time.Second
	return &o
}

// showRightsizing runs the right-sizing part and prints the recommendation and the claims per GPU
// before and after the namespace opts in.
func (c *cluster) showRightsizing(ctx context.Context, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, rsTimeout)
	defer cancel()
	// A directory of its own: its log and kubeconfig beside the ResourceClaim controller's.
	dir := filepath.Join(c.dir, "kcm-apps")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The garbage collector deletes the claims of replaced pods (they are owned by their pods).
	kcm, err := c.env.StartControllerManager(dir, "deployment-controller", "replicaset-controller", "garbage-collector-controller")
	if err != nil {
		return err
	}
	c.appControllers = kcm
	if err := c.applyAdmissionPolicy(ctx); err != nil {
		return err
	}
	if err := c.rsWorkload(ctx); err != nil {
		return err
	}
	if err := c.waitRSClaims(ctx, 3, rsClaim); err != nil {
		return err
	}
	before, err := c.rsClaimsPerGPU(ctx)
	if err != nil {
		return err
	}
	say("%d pods of Deployment %s/%s hold %dMi of their %s claims; the recommender samples them", 3, rsNamespace, rsWorkload, rsUsedMiB, rsClaim)
	rec, err := c.waitRecommendation(ctx, func(r *v1alpha1.GPUShareRecommendation) bool {
		return r.Status.InitialMemory != nil && r.Status.Samples >= 3
	})
	if err != nil {
		return err
	}
	if err := c.runKubectl(ctx, w, "get", "gpusharerecommendations", "-n", rsNamespace); err != nil {
		return err
	}
	if m := rec.Status.Memory; m != nil && m.Target != nil {
		if _, err := fmt.Fprintf(w, "target %dMi (the pods' peak plus 10 %%), a claim of %s at the sized policy's 1Gi memoryStep\n", m.Target.Value()>>20, rec.Status.InitialMemory); err != nil {
			return err
		}
	}
	initial := rec.Status.InitialMemory.String()

	fmt.Println()
	say("Opting namespace %s in (gpusharing.io/rightsizing=Initial), replacing its pods and scaling to %d: new claims get %s at creation", rsNamespace, rsScaled, initial)
	if err := c.runKubectl(ctx, w, "label", "namespace", rsNamespace, v1alpha1.RightsizingModeKey+"=Initial"); err != nil {
		return err
	}
	if _, err := c.waitRecommendation(ctx, func(r *v1alpha1.GPUShareRecommendation) bool { return r.Status.Mode == v1alpha1.RightsizingInitial }); err != nil {
		return err
	}
	if err := c.runKubectl(ctx, w, "-n", rsNamespace, "delete", "pods", "-l", "app="+rsWorkload, "--wait=true", "--timeout=60s"); err != nil {
		return err
	}
	if err := c.runKubectl(ctx, w, "-n", rsNamespace, "scale", "deployment/"+rsWorkload, "--replicas="+strconv.Itoa(rsScaled)); err != nil {
		return err
	}
	if err := c.waitRSClaims(ctx, rsScaled, initial); err != nil {
		return err
	}
	after, err := c.rsClaimsPerGPU(ctx)
	if err != nil {
		return err
	}
	cols := "CLAIM:.metadata.name,MEMORY:.spec.devices.requests[0].exactly.capacity.requests.memory,DEVICE:.status.allocation.devices.results[0].device"
	if err := c.runKubectl(ctx, w, "-n", rsNamespace, "get", "resourceclaims", "-o", "custom-columns="+cols); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "claims of %s per GPU of %s: before, at %s: %s; after, at %s: %s\n", rsWorkload, sizedNode, rsClaim, before, initial, after)
	return err
}

// applyAdmissionPolicy creates the right-sizing MutatingAdmissionPolicy and its binding as users apply them.
func (c *cluster) applyAdmissionPolicy(ctx context.Context) error {
	raw, err := os.ReadFile(filepath.Join(c.env.RepoRoot, rsAdmissionPolicy))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var obj client.Object = &admissionv1.MutatingAdmissionPolicy{}
		if strings.Contains(doc, "kind: MutatingAdmissionPolicyBinding") {
			obj = &admissionv1.MutatingAdmissionPolicyBinding{}
		}
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			return fmt.Errorf("%s: %w", rsAdmissionPolicy, err)
		}
		if err := c.env.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("applying %s: %w", obj.GetName(), err)
		}
	}
	return nil
}

// rsWorkload creates the namespace, its ResourceClaimTemplate (10Gi and 5 % of a sized GPU) and the
// Deployment of three pods on the notebook pool whose containers declare 3Gi and 30 % of simulated use.
func (c *cluster) rsWorkload(ctx context.Context) error {
	cl := c.env.Client
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rsNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: rsNamespace, Name: "default"}},
		&resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: rsNamespace, Name: "gpu"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized",
					Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
						dra.CapacityMemory: resource.MustParse(rsClaim), dra.CapacityCompute: resource.MustParse("5")}}}}}}}}},
	}
	labels := map[string]string{"app": rsWorkload}
	objs = append(objs, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: rsNamespace, Name: rsWorkload},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"pool": "notebooks"},
					Containers: []corev1.Container{{Name: "web", Image: "web",
						Env: []corev1.EnvVar{{Name: nvmlmock.EnvSimulatedMemoryMiB, Value: strconv.Itoa(rsUsedMiB)},
							{Name: nvmlmock.EnvSimulatedSMPercent, Value: "30"}},
						Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
					ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}}}}}})
	for _, o := range objs {
		if err := cl.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			return fmt.Errorf("creating %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
	return nil
}

// waitRSClaims waits until n pods of the workload run, each with its claim allocated at memory, and no
// other claim of the namespace is left.
func (c *cluster) waitRSClaims(ctx context.Context, n int, memory string) error {
	var last string
	for {
		var pods corev1.PodList
		var claims resourcev1.ResourceClaimList
		err := c.env.Client.List(ctx, &pods, client.InNamespace(rsNamespace), client.MatchingLabels{"app": rsWorkload})
		if err == nil {
			err = c.env.Client.List(ctx, &claims, client.InNamespace(rsNamespace))
		}
		if err == nil {
			running, sized, live := 0, 0, 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			for _, cl := range claims.Items {
				if cl.DeletionTimestamp == nil {
					live++
				}
				if cl.DeletionTimestamp == nil && cl.Status.Allocation != nil && claimMemory(&cl) == memory {
					sized++
				}
			}
			last = fmt.Sprintf("%d pods Running, %d claims of %s allocated, %d claims", running, sized, memory, live)
			// The claims of replaced pods gone too (the ResourceClaim controller deletes them).
			if running == n && sized == n && live == n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d pods of %s with %s claims: %s", n, rsWorkload, memory, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func claimMemory(c *resourcev1.ResourceClaim) string {
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil && r.Exactly.Capacity != nil {
			if q, ok := r.Exactly.Capacity.Requests[dra.CapacityMemory]; ok {
				return q.String()
			}
		}
	}
	return ""
}

// rsClaimsPerGPU counts the workload's allocated claims per device: "gpu-5-sized: 3".
func (c *cluster) rsClaimsPerGPU(ctx context.Context) (string, error) {
	var claims resourcev1.ResourceClaimList
	if err := c.env.Client.List(ctx, &claims, client.InNamespace(rsNamespace)); err != nil {
		return "", err
	}
	count := map[string]int{}
	for _, cl := range claims.Items {
		if cl.DeletionTimestamp == nil && cl.Status.Allocation != nil && len(cl.Status.Allocation.Devices.Results) > 0 {
			count[cl.Status.Allocation.Devices.Results[0].Device]++
		}
	}
	var parts []string
	for d, n := range count {
		parts = append(parts, fmt.Sprintf("%s: %d", d, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", "), nil
}

// waitRecommendation waits until the workload's recommendation satisfies ok.
func (c *cluster) waitRecommendation(ctx context.Context, ok func(*v1alpha1.GPUShareRecommendation) bool) (*v1alpha1.GPUShareRecommendation, error) {
	var last string
	for {
		var r v1alpha1.GPUShareRecommendation
		err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: rsNamespace, Name: rsRecName}, &r)
		if err == nil && ok(&r) {
			return &r, nil
		}
		last = fmt.Sprintf("%v %+v", err, r.Status.Conditions)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for GPUShareRecommendation %s/%s: %s", rsNamespace, rsRecName, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
