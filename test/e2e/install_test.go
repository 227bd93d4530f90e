//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// testInstall is docs/deploy.md's install on the local node: apply the overlay, wait for the manager
// Deployment and the agent DaemonSet to roll out, and find the node's GPUNode with its 8 GPUs.
func testInstall(t *testing.T) {
	dumpOnFailure(t)
	kubectl(t, "apply", "--server-side", "-k", "config/e2e")
	kubectl(t, "-n", "gpusharing-system", "rollout", "status", "deployment/gpusharing-manager", "--timeout=180s")
	kubectl(t, "-n", "gpusharing-system", "rollout", "status", "daemonset/gpusharing-agent", "--timeout=180s")
	c := clientFor(t)
	eventually(t, 2*time.Minute, "GPUNode "+NodeName+" with 8 GPUs", func(ctx context.Context) error {
		var gn v1alpha1.GPUNode
		if err := c.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
			return err
		}
		if len(gn.Status.GPUs) != 8 {
			return fmt.Errorf("%d GPUs in status", len(gn.Status.GPUs))
		}
		return nil
	})
	// kubectl caches discovery on disk: a cache written by the apply above, before the CRDs were served,
	// lacks the category, and kubectl drops a stale cache only after a lookup failed with it, so the
	// first `get gpusharing` can fail where the next one succeeds (as it would for a user).
	var out string
	eventually(t, 30*time.Second, "kubectl get gpusharing", func(context.Context) error {
		var err error
		out, err = kubectlErr("get", "gpusharing", "-o", "wide")
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	t.Log(out)
}
