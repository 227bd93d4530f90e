package podpid

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PodOf tells a host process from a process of a pod this node lists, of a pod it does not list, and of
// a process whose cgroup cannot be read; a listed pod comes with the ResourceClaims it uses, named in its
// spec or recorded in its status for its templates.
func TestPodOfSaysWhereAProcessIsAndNamesItsClaims(t *testing.T) {
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "claims", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "node-w", Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			ResourceClaims: []corev1.PodResourceClaim{
				{Name: "shared", ResourceClaimName: ptr.To("team-gpu")},
				{Name: "own", ResourceClaimTemplateName: ptr.To("one-gpu")},
			}},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "own", ResourceClaimName: ptr.To("claims-own-x7k2p")}}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	other := createPod(t, "elsewhere-w", "node-v")

	root := t.TempDir()
	writeCgroup(t, root, 60, cgroupOf(p))
	writeCgroup(t, root, 61, cgroupOf(other))
	writeCgroup(t, root, 62, "0::/system.slice/nvidia-mps.service\n")
	r := &Resolver{Reader: env.Client, NodeName: "node-w", ProcRoot: root}

	got, where := r.PodOf(ctx, 60)
	if where != InPod || got.UID != string(p.UID) || got.Namespace != "default" || got.Name != "claims" ||
		!slices.Equal(got.Claims, []string{"claims-own-x7k2p", "team-gpu"}) {
		t.Errorf("pod's process: %+v, %v; want default/claims InPod with claims [claims-own-x7k2p team-gpu]", got, where)
	}
	if got, where := r.PodOf(ctx, 61); where != InUnlistedPod || got.UID != string(other.UID) || got.Name != "" {
		t.Errorf("process of another node's pod: %+v, %v; want its UID, no name, InUnlistedPod", got, where)
	}
	if _, where := r.PodOf(ctx, 62); where != OnHost {
		t.Errorf("host process: %v, want OnHost", where)
	}
	if _, where := r.PodOf(ctx, 63); where != Unreadable {
		t.Errorf("pid without a /proc entry: %v, want Unreadable", where)
	}
}
