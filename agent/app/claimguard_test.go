package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// withinClaims waits for the sized GPU's WithinClaims condition with status and reason, its message
// containing every one of want.
func withinClaims(uuid string, status metav1.ConditionStatus, reason string, want ...string) func(*v1alpha1.GPUNode) (bool, string) {
	return func(g *v1alpha1.GPUNode) (bool, string) {
		gs := gpuState(g, uuid)
		if gs == nil {
			return false, "GPU not listed"
		}
		c := meta.FindStatusCondition(gs.Conditions, v1alpha1.ConditionWithinClaims)
		if c == nil || c.Status != status || c.Reason != reason {
			return false, fmt.Sprintf("WithinClaims %+v", c)
		}
		for _, w := range want {
			if !strings.Contains(c.Message, w) {
				return false, fmt.Sprintf("WithinClaims message %q lacks %q", c.Message, w)
			}
		}
		return true, ""
	}
}

// A process of the claim's pod that holds more than the claim (one that dropped its MPS limit) turns
// the GPU's WithinClaims False naming the pod, with a warning event on the pod. With onExceed Evict the
// pod is evicted; with Report it is not, and back within its claim the condition is True again.
func TestAPodOverItsSizedClaimIsReportedAndEvictedWhereThePolicySays(t *testing.T) {
	for _, action := range []v1alpha1.ExceedAction{v1alpha1.ExceedReport, v1alpha1.ExceedEvict} {
		t.Run(string(action), func(t *testing.T) {
			ctx := context.Background()
			pc := prepareSizedClaim(t, v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, OnExceed: action})
			pc.n.waitFor(t, "the pod within its claim", withinClaims(pc.gpu, metav1.ConditionTrue, v1alpha1.ReasonAsClaimed))

			pc.n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(pc.pid, 12<<30, 40))
			passed := time.Now()
			pc.n.waitFor(t, "the pod over its claim reported", withinClaims(pc.gpu, metav1.ConditionFalse, v1alpha1.ReasonClaimExceeded,
				pc.pod.Namespace+"/"+pc.pod.Name+" holds 12Gi, its claims 10Gi"))
			t.Logf("%s: reported %s after its process passed the claim", action, time.Since(passed).Round(10*time.Millisecond))
			wait.UntilState(t, 30*time.Second, func() (bool, string) {
				got := eventsAbout(t, "Pod", pc.pod.Name, v1alpha1.ReasonClaimExceeded)
				return len(got) == 1 && strings.HasPrefix(got[0], "Warning: ") && strings.Contains(got[0], "holds 12Gi, its claims 10Gi"),
					fmt.Sprintf("events on the pod: %q", got)
			}, "a warning event on the pod")

			// The pass that published the condition had already evicted (or not): the status is written last.
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(pc.pod), pc.pod)
			evicted := apierrors.IsNotFound(err) || err == nil && pc.pod.DeletionTimestamp != nil
			if evicted != (action == v1alpha1.ExceedEvict) {
				t.Fatalf("onExceed %s: pod evicted = %v (get: %v)", action, evicted, err)
			}
			if action == v1alpha1.ExceedEvict {
				return
			}
			pc.n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(pc.pid, 3<<30, 40))
			pc.n.waitFor(t, "the pod within its claim again", withinClaims(pc.gpu, metav1.ConditionTrue, v1alpha1.ReasonAsClaimed))
		})
	}
}

// A claim reserved for a second pod after it was prepared (the kubelet prepares a claim once per node):
// the agent reads the claim's consumers from the API server and judges both pods together against the
// claim, neither "over a claim of 0" alone. Within it together, nothing is reported; past it, both are
// named.
func TestASharedClaimsPodsAreJudgedTogetherAgainstIt(t *testing.T) {
	ctx := context.Background()
	pc := prepareSizedClaim(t, v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, OnExceed: v1alpha1.ExceedReport})
	pc.n.waitFor(t, "the first pod within its claim", withinClaims(pc.gpu, metav1.ConditionTrue, v1alpha1.ReasonAsClaimed))

	const pid2 = 4344
	second := accountedPod(t, "second-"+pc.n.name, pc.n.name, pc.procRoot, pid2)
	claim := pc.claim.DeepCopy()
	testenv.UpdateStatus(t, ctx, env.Client, claim, func(c *resourcev1.ResourceClaim) {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: second.Name, UID: second.UID})
	})
	// 3 GiB and 6 GiB of the 10Gi claim.
	pc.n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(pc.pid, 3<<30, 40), nvmlmock.Proc(pid2, 6<<30, 40))
	pc.n.waitFor(t, "both pods within the claim they share", func(g *v1alpha1.GPUNode) (bool, string) {
		ok, why := withinClaims(pc.gpu, metav1.ConditionTrue, v1alpha1.ReasonAsClaimed)(g)
		if !ok {
			return false, why
		}
		// The status lists the claim with both pods and their 9 GiB.
		for _, c := range gpuState(g, pc.gpu).Sized.Claims {
			if c.Name == claim.Name && len(c.Pods) == 2 && c.MemoryUsed != nil && c.MemoryUsed.Value() == 9<<30 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("sized %+v", gpuState(g, pc.gpu).Sized)
	})
	if got := eventsAbout(t, "Pod", second.Name, v1alpha1.ReasonClaimExceeded); len(got) != 0 {
		t.Errorf("events on the second pod within the shared claim: %q", got)
	}
	pc.n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(pc.pid, 3<<30, 40), nvmlmock.Proc(pid2, 8<<30, 40))
	pc.n.waitFor(t, "the pair over the claim they share", withinClaims(pc.gpu, metav1.ConditionFalse, v1alpha1.ReasonClaimExceeded,
		"default/"+second.Name+" and default/"+pc.pod.Name+" hold 11Gi, their claims 10Gi"))
}
