package node

import (
	"fmt"
	"strings"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// ClaimPodSource names the pods of the prepared claims per GPU index (*dra.KubeletPlugin).
type ClaimPodSource interface {
	ClaimPods() map[int32][]string
}

// claimPods asks the kubelet plugin, where one runs, for the pods of its prepared claims.
func (r *Reconciler) claimPods() map[int32][]string {
	if s, ok := r.Claims.(ClaimPodSource); ok {
		return s.ClaimPods()
	}
	return nil
}

// claimedBySummary renders the pods holding each GPU's prepared claims for the wide table:
// "0:ml/notebook 4:ml/a,ml/b,ml/c,+2", only GPUs with such pods, at most MaxClaimedByPodsInSummary each.
// pods are sorted per GPU.
func claimedBySummary(gpus []v1alpha1.GPUStatus, pods map[int32][]string) string {
	return perGPUSummary(gpus, func(g *v1alpha1.GPUStatus) (string, bool) {
		p := pods[g.Index]
		switch n := len(p); {
		case n == 0:
			return "", false
		case n > v1alpha1.MaxClaimedByPodsInSummary:
			return fmt.Sprintf("%s,+%d", strings.Join(p[:v1alpha1.MaxClaimedByPodsInSummary], ","), n-v1alpha1.MaxClaimedByPodsInSummary), true
		default:
			return strings.Join(p, ","), true
		}
	})
}
