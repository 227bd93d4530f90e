package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestGPUShareRecommendationAdmission(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name    string
		spec    v1.GPUShareRecommendationSpec
		wantErr string
	}{
		{"accepts a Deployment's claim", v1.GPUShareRecommendationSpec{Workload: v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, PodClaim: "gpu", Request: "gpu"}, ""},
		{"rejects a pod claim name that is no DNS label", v1.GPUShareRecommendationSpec{Workload: v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, PodClaim: "GPU_0", Request: "gpu"}, "podClaim: must be a DNS label such as gpu"},
		{"rejects a request name that is no DNS label", v1.GPUShareRecommendationSpec{Workload: v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, PodClaim: "gpu", Request: "a.b"}, "request: must be a DNS label such as gpu"},
		{"rejects an unknown workload kind", v1.GPUShareRecommendationSpec{Workload: v1.WorkloadRef{Kind: "Rollout", Name: "web"}, PodClaim: "gpu", Request: "gpu"}, `spec.workload.kind: Unsupported value: "Rollout"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			obj := &v1.GPUShareRecommendation{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "rec-"}, Spec: tt.spec}
			err := env.Client.Create(ctx, obj)
			if err == nil {
				t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
