package node

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// staleReads answers every Get of one GPUNode with an old copy, as the agent's cache does while its
// watch is still reconnecting after an API server outage; everything else goes to the API server.
type staleReads struct {
	client.Client
	node *v1alpha1.GPUNode
}

func (s staleReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if n, ok := obj.(*v1alpha1.GPUNode); ok && key.Name == s.node.Name {
		s.node.DeepCopyInto(n)
		return nil
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// The cache holds a GPUNode older than the API server's (a write it has not seen yet) and the pass has
// something new to publish: the write from the cache conflicts, and the pass must still publish, over
// the object the API server holds, rather than fail on every pass until the watch is back.
func TestAPassPublishesWhileTheCacheIsBehind(t *testing.T) {
	a := newAgent(t, withNVML)
	published := a.pass(t)

	cached := published.DeepCopy()
	cached.Status.Summary = "as before the outage"
	unseen := published.DeepCopy()
	unseen.Status.Summary = "written while the watch was down"
	if err := env.Client.Status().Update(context.Background(), unseen); err != nil {
		t.Fatal(err)
	}
	a.r.Client = staleReads{Client: env.Client, node: cached}
	a.r.Live = env.Client
	if _, err := a.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: a.r.NodeName}}); err != nil {
		t.Fatalf("Reconcile with the cache behind the API server: %v", err)
	}
	n := &v1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: a.r.NodeName}, n); err != nil {
		t.Fatal(err)
	}
	if n.Status.Summary != published.Status.Summary {
		t.Errorf("status summary %q, want the pass's %q", n.Status.Summary, published.Status.Summary)
	}
	if n.ResourceVersion == unseen.ResourceVersion {
		t.Errorf("the GPUNode was not written after the conflicting write")
	}
}

// When the cache is behind on the spec too, the pass converged to the older spec: its status must not be
// written over the newer one (it would report the new spec's generation as applied), and the pass fails
// with the conflict until the cache has the new spec. Nothing is applied from the newer spec meanwhile.
func TestAPassDoesNotPublishOverANewerSpec(t *testing.T) {
	a := newAgent(t, withNVML)
	published := a.pass(t)
	cached := published.DeepCopy()
	cached.Status.Summary = "as before the outage"
	a.setSpec(t, v1alpha1.GPUDesired{UUID: a.server.GPUs[0].UUID, Sharing: migSharing("7g.40gb x1")})
	a.r.Client = staleReads{Client: env.Client, node: cached}
	a.r.Live = env.Client
	_, err := a.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: a.r.NodeName}})
	if !apierrors.IsConflict(err) {
		t.Fatalf("Reconcile with the cache behind on the spec: %v, want the conflict", err)
	}
	n := &v1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: a.r.NodeName}, n); err != nil {
		t.Fatal(err)
	}
	if n.Status.ObservedGeneration == n.Generation {
		t.Errorf("status claims generation %d, which the pass never saw", n.Generation)
	}
	if mode, _, _ := a.server.GPUs[0].GetMigMode(); mode == nvml.DEVICE_MIG_ENABLE {
		t.Error("MIG was enabled from a spec the pass never read")
	}
}
