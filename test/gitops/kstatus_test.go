package gitops

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/policy"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// kstatusOf reads the object back from the API server as Flux does, untyped (a typed read would drop a
// zero observedGeneration through omitempty), and computes its kstatus; obj is refreshed too.
func kstatusOf(t *testing.T, obj client.Object) *status.Result {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	gvk, err := apiutil.GVKForObject(obj, env.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	u.SetGroupVersionKind(gvk)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), u); err != nil {
		t.Fatal(err)
	}
	res, err := status.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func failure(reason, msg string) policy.Failure {
	return policy.Failure{GPURef: policy.GPURef{Node: "gpu-a2", Index: 1}, Reason: reason, Message: msg}
}

func TestKstatusOfAGPUSharingPolicyInEveryPhase(t *testing.T) {
	ctx := context.Background()
	p := &v1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "kstatus-policy", Finalizers: []string{policy.Finalizer}},
		Spec:       v1.GPUSharingPolicySpec{Sharing: v1.Sharing{Strategy: v1.StrategyMPS, MPS: &v1.MPSSharing{Replicas: 4}}},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	// Before the controller's first pass: nothing is known, which must not read as Current.
	if res := kstatusOf(t, p); res.Status != status.InProgressStatus {
		t.Errorf("a new policy is %s (%s), want InProgress", res.Status, res.Message)
	}

	phases := []struct {
		name    string
		summary policy.Summary
		want    status.Status
	}{
		{"applying", policy.Summary{MatchedNodes: 2, MatchedGPUs: 4, ReadyGPUs: 2, Applying: []policy.GPURef{{Node: "gpu-a1", Index: 1}}}, status.InProgressStatus},
		{"waiting for the rollout budget", policy.Summary{MatchedNodes: 3, MatchedGPUs: 3, ReadyGPUs: 1, WaitingNodes: []string{"gpu-a3"}, InFlightNodes: []string{"gpu-a2"}}, status.InProgressStatus},
		{"rolled out", policy.Summary{MatchedNodes: 2, MatchedGPUs: 4, ReadyGPUs: 4}, status.CurrentStatus},
		{"drain timed out", policy.Summary{MatchedNodes: 2, MatchedGPUs: 4, ReadyGPUs: 3,
			Failures: []policy.Failure{failure(v1.ReasonDrainTimedOut, "pods default/train-0 still use the GPU after the drain timeout 10m0s")}}, status.FailedStatus},
		{"hardware refused while other GPUs still apply", policy.Summary{MatchedNodes: 2, MatchedGPUs: 4, ReadyGPUs: 2, Applying: []policy.GPURef{{Node: "gpu-a1", Index: 1}},
			Failures: []policy.Failure{failure(v1.ReasonLayoutDoesNotFit, "MIG layout 3g.40gb x3 does not fit")}}, status.FailedStatus},
		{"rolled out again after the failure is fixed", policy.Summary{MatchedNodes: 2, MatchedGPUs: 4, ReadyGPUs: 4}, status.CurrentStatus},
	}
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			// What the controller's pass writes: the conditions from the summary, then observedGeneration.
			policy.SetStatus(p, ph.summary, 1)
			p.Status.ObservedGeneration = p.Generation
			if err := env.Client.Status().Update(ctx, p); err != nil {
				t.Fatal(err)
			}
			if res := kstatusOf(t, p); res.Status != ph.want {
				t.Errorf("kstatus = %s (%s), want %s; conditions %+v", res.Status, res.Message, ph.want, p.Status.Conditions)
			}
		})
	}

	t.Run("a spec change not yet observed is InProgress although Ready is True", func(t *testing.T) {
		p.Spec.Sharing.MPS.Replicas = 8
		if err := env.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		if !meta.IsStatusConditionTrue(p.Status.Conditions, v1.ConditionReady) {
			t.Fatal("the previous phase should have left Ready True")
		}
		if res := kstatusOf(t, p); res.Status != status.InProgressStatus {
			t.Errorf("kstatus = %s (%s), want InProgress for generation %d observed %d", res.Status, res.Message, p.Generation, p.Status.ObservedGeneration)
		}
	})

	t.Run("deleted: the finalizer restores the default", func(t *testing.T) {
		if err := env.Client.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			t.Fatal(err)
		}
		policy.SetRestoringConditions(p, []policy.GPURef{{Node: "gpu-a1", Index: 0}}, metav1.NewTime(time.Now().Add(time.Minute)))
		if err := env.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		if res := kstatusOf(t, p); res.Status != status.TerminatingStatus {
			t.Errorf("kstatus = %s (%s), want Terminating", res.Status, res.Message)
		}
		p.Finalizers = nil
		if err := env.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	})
}

// The GPUNode's status is the agent's; its phases are the objects the Argo CD tests use (one set of
// phases for both tools), stored through the real API server.
func TestKstatusOfAGPUNodeInEveryPhase(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(testenv.RepoRoot(), "config", "argocd", "gpusharing.io", "GPUNode", "testdata")
	fresh := &v1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "kstatus-fresh"}}
	if err := env.Client.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	// GPUNodes carry no finalizer here: deleted at the end, a second run of the test creates them anew.
	t.Cleanup(func() { _ = env.Client.Delete(ctx, fresh) })
	if res := kstatusOf(t, fresh); res.Status != status.InProgressStatus {
		t.Errorf("a GPUNode no agent has reported is %s (%s), want InProgress", res.Status, res.Message)
	}
	for file, want := range map[string]status.Status{
		"applying.yaml":         status.InProgressStatus,
		"draining.yaml":         status.InProgressStatus,
		"applied.yaml":          status.CurrentStatus,
		"drain-timed-out.yaml":  status.FailedStatus,
		"hardware-refused.yaml": status.FailedStatus,
		"nvml-unavailable.yaml": status.FailedStatus,
		"xid-error.yaml":        status.FailedStatus,
	} {
		t.Run(file, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: readObject(t, filepath.Join(dir, file))}
			var want0 v1.GPUNode
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &want0); err != nil {
				t.Fatal(err)
			}
			n := &v1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "kstatus-" + file[:len(file)-5]}, Spec: want0.Spec}
			if err := env.Client.Create(ctx, n); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, n) })
			n.Status = want0.Status
			n.Status.ObservedGeneration = n.Generation
			if err := env.Client.Status().Update(ctx, n); err != nil {
				t.Fatal(err)
			}
			if res := kstatusOf(t, n); res.Status != want {
				t.Errorf("kstatus = %s (%s), want %s", res.Status, res.Message, want)
			}
			// A spec the agent has not acted on yet is InProgress whatever the old status says.
			n.Spec.GPUs[0].Sharing = v1.Sharing{Strategy: v1.StrategyExclusive}
			if err := env.Client.Update(ctx, n); err != nil {
				t.Fatal(err)
			}
			if res := kstatusOf(t, n); res.Status != status.InProgressStatus {
				t.Errorf("after a spec change kstatus = %s (%s), want InProgress", res.Status, res.Message)
			}
		})
	}
}
