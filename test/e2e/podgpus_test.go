//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// checkPodGPUs checks that the GPUNode's status.pods lists the pod once with exactly the GPUs of uuids,
// each with memory bytes.
func checkPodGPUs(t *testing.T, pod string, memory int64, uuids []string) {
	t.Helper()
	eventually(t, time.Minute, pod+" listed in status.pods with both GPUs", func(ctx context.Context) error {
		return podGPUsListed(ctx, pod, memory, uuids)
	})
}

func podGPUsListed(ctx context.Context, pod string, memory int64, uuids []string) error {
	var gn v1alpha1.GPUNode
	if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &gn); err != nil {
		return err
	}
	var found []v1alpha1.PodGPUs
	for _, p := range gn.Status.Pods {
		if p.Namespace == Namespace && p.Name == pod {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return fmt.Errorf("status.pods lists %s/%s %d times, want once: %+v", Namespace, pod, len(found), gn.Status.Pods)
	}
	var got []string
	for _, g := range found[0].GPUs {
		if g.MemoryUsed == nil || g.MemoryUsed.Value() != memory {
			return fmt.Errorf("%s/%s on GPU %d (%s): memoryUsed %v, want %d bytes", Namespace, pod, g.Index, g.UUID, g.MemoryUsed, memory)
		}
		got = append(got, g.UUID)
	}
	want := slices.Clone(uuids)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("status.pods lists %s/%s on %v, want %v", Namespace, pod, got, want)
	}
	return nil
}
