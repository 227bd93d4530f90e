//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// exclusiveGPU4 takes GPU 4 out of time-slicing: a disruptive change of one GPU, drained by eviction.
const exclusiveGPU4 = `apiVersion: gpusharing.io/v1alpha1
kind: GPUSharingPolicy
metadata:
  name: e2e-exclusive-4
spec:
  priority: 20
  nodeSelector: {matchLabels: {nvidia.com/gpu.present: "true"}}
  gpus: {indices: [4]}
  sharing: {strategy: Exclusive}
  rollout:
    drain: {mode: Evict, timeout: 5m}
`

// testDrain changes GPU 4 while a two-replica Deployment with a PodDisruptionBudget (minAvailable 2) runs
// one replica there and one on GPU 5, and bystanders run on an MPS and a shim GPU: only the pod on GPU 4 is
// evicted, not before the budget allows it (after a third replica, which can only land on GPU 5's free
// share, is Ready), and the pods on other GPUs keep their containers.
//
// The third replica schedules only because GPU 4's held share stays in the node's allocatable while its
// pod runs: hidden, the scheduler would count GPU 4's pod against GPU 5's two shares and see no room, and
// the budget would wait for a replacement that waits for the eviction.
func testDrain(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	gpus, _ := gpuUUIDs(t)
	app := map[string]string{"app": "ts-app"}
	tmpl := sharePod("", "gpusharing.io/gpu-timeslice", 1, app)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "ts-app", Namespace: Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: app},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: app}, Spec: tmpl.Spec},
		},
	}
	must(t, k8s.Create(ctx, dep))
	must(t, k8s.Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "ts-app", Namespace: Namespace},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr(intstr.FromInt32(2)), Selector: &metav1.LabelSelector{MatchLabels: app}},
	}))
	kubectl(t, "-n", Namespace, "rollout", "status", "deployment/ts-app", "--timeout=120s")
	must(t, k8s.Create(ctx, sharePod("bystander-mps", "gpusharing.io/gpu-mps", 1, nil)))
	must(t, k8s.Create(ctx, sharePod("bystander-shim", "gpusharing.io/gpu-shared", 1, nil)))
	kubectl(t, "-n", Namespace, "wait", "--for=condition=Ready", "pod/bystander-mps", "pod/bystander-shim", "--timeout=60s")

	// Which pod is on which GPU, from each container's own output.
	onGPU := map[string]string{} // pod -> gpu uuid
	for _, p := range podsOf(t, app) {
		onGPU[p.Name] = readReport(t, p.Name).env["NVIDIA_VISIBLE_DEVICES"]
	}
	var victim, neighbour string
	for pod, uuid := range onGPU {
		switch uuid {
		case gpus[4]:
			victim = pod
		case gpus[5]:
			neighbour = pod
		}
	}
	if victim == "" || neighbour == "" {
		t.Fatalf("ts-app's replicas are on %v, want one on GPU 4 (%s) and one on GPU 5 (%s): the least used GPU, lowest index first", onGPU, gpus[4], gpus[5])
	}
	before := containerIDs(t, "bystander-mps", "bystander-shim")

	applyYAML(t, exclusiveGPU4)

	// The drain cordons GPU 4 and asks to evict its pod; the budget (2 of 2 must stay) refuses.
	eventually(t, time.Minute, "GPU 4 draining", func(ctx context.Context) error {
		return gpuHasCondition(ctx, 4, "Draining")
	})
	time.Sleep(5 * time.Second)
	if !podExists(t, victim) {
		t.Fatalf("%s was evicted although its PodDisruptionBudget allowed no disruption", victim)
	}
	// GPU 4's pod still holds its share, so the node still advertises it; its free share is gone.
	eventually(t, time.Minute, "allocatable: GPU 5's two shares and GPU 4's held one", func(ctx context.Context) error {
		return allocatableIs(ctx, map[corev1.ResourceName]int64{"gpusharing.io/gpu-timeslice": 3})
	})
	// A third replica: it can only land on GPU 5's free share.
	kubectl(t, "-n", Namespace, "scale", "deployment/ts-app", "--replicas=3")
	// Until the replacement is Ready the budget allows no disruption: the victim must be there at every
	// look (the eviction may follow the replacement's Ready within a poll, so only the order is checked).
	var replacementReady time.Time
	evictedEarly := false
	eventually(t, 2*time.Minute, "a third ts-app replica Ready", func(ctx context.Context) error {
		ready := 0
		for _, p := range podsOf(t, app) {
			if p.Name != victim && p.DeletionTimestamp == nil && isReady(p) {
				ready++
			}
		}
		if ready < 2 {
			if !podExists(t, victim) {
				evictedEarly = true
				return nil
			}
			return fmt.Errorf("replacement not Ready yet")
		}
		replacementReady = time.Now()
		return nil
	})
	if evictedEarly {
		t.Fatalf("%s was evicted before its replacement was Ready: the PodDisruptionBudget did not hold", victim)
	}
	eventually(t, 2*time.Minute, victim+" evicted once the budget allows it", func(ctx context.Context) error {
		if podExists(t, victim) {
			return fmt.Errorf("still there")
		}
		return nil
	})
	t.Logf("%s evicted %s after the third replica was Ready", victim, time.Since(replacementReady).Round(time.Second))
	eventually(t, 2*time.Minute, "GPU 4 Exclusive and advertised whole", func(ctx context.Context) error {
		if err := gpuApplied(ctx, 4, v1alpha1.StrategyExclusive); err != nil {
			return err
		}
		return allocatableIs(ctx, map[corev1.ResourceName]int64{"nvidia.com/gpu": 1, "gpusharing.io/gpu-timeslice": 2})
	})
	if after := containerIDs(t, "bystander-mps", "bystander-shim"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("pods on other GPUs were disturbed: containers %v before, %v after", before, after)
	}
	kubectl(t, "delete", "gpusharingpolicy", "e2e-exclusive-4")
	kubectl(t, "-n", Namespace, "delete", "deployment/ts-app", "pdb/ts-app", "pod/bystander-mps", "pod/bystander-shim", "--wait=true", "--timeout=60s")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// applyYAML applies a manifest with kubectl, as an operator would.
func applyYAML(t *testing.T, manifest string) {
	t.Helper()
	f := t.TempDir() + "/manifest.yaml"
	must(t, writeFile(f, manifest))
	kubectl(t, "apply", "-f", f)
}

func podsOf(t *testing.T, labels map[string]string) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	must(t, k8s.List(context.Background(), &l, client.InNamespace(Namespace), client.MatchingLabels(labels)))
	return l.Items
}

func podExists(t *testing.T, name string) bool {
	t.Helper()
	var p corev1.Pod
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: Namespace, Name: name}, &p)
	return err == nil
}

func isReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerIDs are the pods' container IDs and restart counts: a pod left alone keeps both.
func containerIDs(t *testing.T, pods ...string) []string {
	t.Helper()
	var out []string
	for _, name := range pods {
		var p corev1.Pod
		must(t, k8s.Get(context.Background(), client.ObjectKey{Namespace: Namespace, Name: name}, &p))
		for _, c := range p.Status.ContainerStatuses {
			out = append(out, fmt.Sprintf("%s/%s=%s restarts=%d", name, c.Name, c.ContainerID, c.RestartCount))
		}
	}
	return out
}

func gpuStatus(ctx context.Context, index int32) (*v1alpha1.GPUStatus, error) {
	var gn v1alpha1.GPUNode
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
		return nil, err
	}
	for i := range gn.Status.GPUs {
		if gn.Status.GPUs[i].Index == index {
			return &gn.Status.GPUs[i], nil
		}
	}
	return nil, fmt.Errorf("GPU %d not in status", index)
}

// gpuHasCondition is true when any condition of the GPU has the reason.
func gpuHasCondition(ctx context.Context, index int32, reason string) error {
	g, err := gpuStatus(ctx, index)
	if err != nil {
		return err
	}
	var seen []string
	for _, c := range g.Conditions {
		if c.Reason == reason {
			return nil
		}
		seen = append(seen, c.Type+"="+c.Reason)
	}
	return fmt.Errorf("GPU %d conditions %s", index, strings.Join(seen, ","))
}

func gpuApplied(ctx context.Context, index int32, strategy v1alpha1.Strategy) error {
	g, err := gpuStatus(ctx, index)
	if err != nil {
		return err
	}
	if g.Applied == nil || g.Applied.Strategy != strategy {
		return fmt.Errorf("GPU %d applied %+v, want %s", index, g.Applied, strategy)
	}
	return nil
}
