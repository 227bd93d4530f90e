package testenv

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// envtest runs no kubelet and no disruption controller, so tests that drain or evict write the status
// those would: a pod Running and Ready (the Eviction API ignores budgets for Pending pods and may evict
// unready ones), and a PodDisruptionBudget's allowance.

// RunningPod creates a pod in ns and sets it Running and Ready.
func (e *Env) RunningPod(t testing.TB, ctx context.Context, ns, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.com/cuda:1"}}},
	}
	if err := e.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	e.SetPodPhase(t, ctx, pod, corev1.PodRunning)
	return pod
}

// SetPodPhase writes the pod's phase, Ready exactly when Running.
func (e *Env) SetPodPhase(t testing.TB, ctx context.Context, pod *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	if err := WritePodPhase(ctx, e.Client, pod, phase); err != nil {
		t.Fatal(err)
	}
}

// WritePodPhase is what a kubelet writes for the pod: its phase, Ready exactly when Running. For
// programs without a testing.T (test/gpu/stack plays the kubelet with it).
func WritePodPhase(ctx context.Context, c client.Client, pod *corev1.Pod, phase corev1.PodPhase) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		return err
	}
	pod.Status.Phase = phase
	ready := corev1.ConditionFalse
	if phase == corev1.PodRunning {
		ready = corev1.ConditionTrue
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}
	return c.Status().Update(ctx, pod)
}

// BlockingPDB creates a budget keeping one pod with the labels, and a status that allows no disruption.
func (e *Env) BlockingPDB(t testing.TB, ctx context.Context, ns string, labels map[string]string) *policyv1.PodDisruptionBudget {
	t.Helper()
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "keep-one"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	if err := e.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	e.SetPDBAllowed(t, ctx, pdb, 0)
	return pdb
}

// SetPDBAllowed writes the status a disruption controller would: allowed disruptions, observed now.
func (e *Env) SetPDBAllowed(t testing.TB, ctx context.Context, pdb *policyv1.PodDisruptionBudget, allowed int32) {
	t.Helper()
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
		t.Fatal(err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: pdb.Generation,
		DisruptionsAllowed: allowed,
		CurrentHealthy:     1 + allowed,
		DesiredHealthy:     1,
		ExpectedPods:       1 + allowed,
	}
	if err := e.Client.Status().Update(ctx, pdb); err != nil {
		t.Fatal(err)
	}
}
