package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
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
