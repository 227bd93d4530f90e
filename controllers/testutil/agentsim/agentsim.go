// Package agentsim plays the node agent for the controllers' envtest suites and benchmark: it reports
// each desired sharing applied (or a failure) in GPUNode.status, the way the real agent does.
package agentsim

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	"github.com/gpusharing/gpusharing/controllers/testutil/builders"
)

// Failure makes the simulated agent reject a GPU's desired sharing with this reason and message.
type Failure struct {
	Reason, Message string
}

// Apply sets gn.status as an agent would after applying gn.spec: every listed GPU runs its desired
// sharing, except those in failures (by UUID), which report Applied=False. It says whether anything changed.
func Apply(gn *v1.GPUNode, failures map[string]Failure) bool {
	before := gn.Status.DeepCopy()
	for _, e := range gn.Spec.GPUs {
		g := resolve.FindGPU(gn.Status.GPUs, e.UUID)
		if g == nil {
			continue
		}
		if f, ok := failures[e.UUID]; ok {
			builders.SetCondition(g, v1.ConditionApplied, metav1.ConditionFalse, f.Reason, f.Message)
			continue
		}
		if !resolve.Acked(&e, g) {
			g.Applied = builders.AppliedFor(e.Sharing, e.Policy)
			g.Applied.PolicyGeneration = e.PolicyGeneration
			builders.SetCondition(g, v1.ConditionApplied, metav1.ConditionTrue, v1.ReasonAsDesired, "as desired")
		}
	}
	gn.Status.ObservedGeneration = gn.Generation
	applied := int32(0)
	for _, e := range gn.Spec.GPUs {
		if resolve.Acked(&e, resolve.FindGPU(gn.Status.GPUs, e.UUID)) {
			applied++
		}
	}
	gn.Status.AppliedGPUs = applied
	return !equality.Semantic.DeepEqual(before, &gn.Status)
}

// Ack reads the named GPUNode and writes its status as applied, retrying on conflicts with the
// controller. failures may be nil.
func Ack(ctx context.Context, c client.Client, name string, failures map[string]Failure) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		gn := &v1.GPUNode{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, gn); err != nil {
			return err
		}
		if !Apply(gn, failures) {
			return nil
		}
		if err := c.Status().Update(ctx, gn); err != nil {
			return fmt.Errorf("writing GPUNode %s status: %w", name, err)
		}
		return nil
	})
}
