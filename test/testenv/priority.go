package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/test/wait"
)

// PriorityClass creates pc and waits until the API server admits pods that name it. The Priority
// admission plugin reads classes from its own informer, so a pod created a moment after its class can
// be refused ("no PriorityClass with name ... was found"); a server-side dry run of such a pod shows
// when the plugin knows the class, without creating anything.
func (e *Env) PriorityClass(t testing.TB, ctx context.Context, pc *schedulingv1.PriorityClass) {
	t.Helper()
	if err := e.Client.Create(ctx, pc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), pc) })
	wait.For(t, 30*time.Second, func() error {
		probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "priority-probe-", Namespace: "default"},
			Spec: corev1.PodSpec{PriorityClassName: pc.Name, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		err := e.Client.Create(ctx, probe, client.DryRunAll)
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("admission does not know it yet: %w", err)
		}
		if err != nil {
			t.Fatalf("a dry run of a pod of PriorityClass %s: %v", pc.Name, err) // no wait fixes this
		}
		return nil
	}, "PriorityClass %s known to the API server's admission", pc.Name)
}
