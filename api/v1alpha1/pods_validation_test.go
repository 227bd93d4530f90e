package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestStatusPodsListEachOfAPodsGPUsOnce(t *testing.T) {
	ctx := context.Background()
	obj := gpuNodeWithGPUs("pod-gpu-twice-in-status", "GPU-a")
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
	pod := func(uuids ...string) []any {
		var gpus []any
		for i, u := range uuids {
			gpus = append(gpus, map[string]any{"uuid": u, "index": int64(i), "memoryUsed": "1Gi", "smUtilization": int64(40)})
		}
		return []any{map[string]any{"namespace": "ml", "name": "tp", "gpus": gpus}}
	}
	if err := unstructured.SetNestedSlice(obj.Object, pod("GPU-a", "GPU-b"), "status", "pods"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Status().Update(ctx, obj); err != nil {
		t.Fatalf("a pod on two GPUs: %v", err)
	}
	if err := unstructured.SetNestedSlice(obj.Object, pod("GPU-a", "GPU-a"), "status", "pods"); err != nil {
		t.Fatal(err)
	}
	err := env.Client.Status().Update(ctx, obj)
	if err == nil || !strings.Contains(err.Error(), "status.pods[0].gpus: Invalid value") || !strings.Contains(err.Error(), "each GPU uuid may be listed once") {
		t.Fatalf("a pod listing GPU-a twice: want the uniqueness rule's message on status.pods[0].gpus, got %v", err)
	}
}
