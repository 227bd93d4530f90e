// Package index registers the field indexes the controllers share, so a question such as "which nodes
// have a disruptive change of policy P in flight" is a lookup in the informer cache instead of a scan of
// every GPUNode.
package index

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
)

// InFlightPolicy indexes GPUNodes by the policies for which they have a disruptive change in flight
// (resolve.InFlightPolicies). Rollout admission counts nodes through it.
const InFlightPolicy = "gpusharing.io/inFlightPolicy"

// Setup registers every index with the manager's cache; call it once per manager, before the controllers.
func Setup(ctx context.Context, mgr manager.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &v1.GPUNode{}, InFlightPolicy, func(o client.Object) []string {
		n, ok := o.(*v1.GPUNode)
		if !ok {
			return nil
		}
		return resolve.InFlightPolicies(n)
	})
	if err != nil {
		return fmt.Errorf("indexing GPUNodes by in-flight policy: %w", err)
	}
	return nil
}
