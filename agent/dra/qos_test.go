package dra_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// On a GPU with production classes a claim is opportunistic unless every pod it is reserved for reaches
// the production threshold; a pod that cannot be read is opportunistic. On MPS an opportunistic claim's
// client runs at priority "below normal", under the policy's opportunistic thread cap. Under the shim the
// claim's environment is the same for both classes: no idle window (the scheduler tells production
// its own) and no MPS priority.
func TestClaimsOfOpportunisticPodsOnGPUsWithClasses(t *testing.T) {
	st := mixedNode()
	threads := int32(20)
	st.GPUs[1].Applied.QoS = &v1alpha1.QoS{ProductionPriority: 1000, OpportunisticThreadPercentage: &threads}
	st.GPUs[4].Applied.QoS = &v1alpha1.QoS{ProductionPriority: 1000}
	priorities := map[string]int32{"serve": 1000, "train": 10}
	for _, tt := range []struct {
		name   string
		pods   []string
		device string
		want   []string // env of the claim's CDI device that matter here
		absent []string
	}{
		{"production", []string{"serve"}, "gpu-1-mps-0", []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"}, []string{"CUDA_MPS_CLIENT_PRIORITY"}},
		{"opportunistic", []string{"train"}, "gpu-1-mps-1", []string{"CUDA_MPS_CLIENT_PRIORITY=1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20"}, nil},
		{"shared by both", []string{"serve", "train"}, "gpu-1-mps-0", []string{"CUDA_MPS_CLIENT_PRIORITY=1"}, nil},
		{"a pod that cannot be read", []string{"gone"}, "gpu-1-mps-0", []string{"CUDA_MPS_CLIENT_PRIORITY=1"}, nil},
		{"no classes on the GPU", []string{"train"}, "gpu-2-mps-0", []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"}, []string{"CUDA_MPS_CLIENT_PRIORITY"}},
		{"shim: production", []string{"serve"}, "gpu-4-shared-0", []string{"GPUSHARE_OVERSUB=1"}, []string{"GPUSHARE_IDLE_MS", "GPUSHARE_IDLE_US", "CUDA_MPS_CLIENT_PRIORITY"}},
		{"shim: opportunistic", []string{"train"}, "gpu-4-shared-1", []string{"GPUSHARE_OVERSUB=1"}, []string{"GPUSHARE_IDLE_MS", "GPUSHARE_IDLE_US", "CUDA_MPS_CLIENT_PRIORITY"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dirs := newPluginDirs(t)
			p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			p.Update(st)
			p.PodPriority = func(_ context.Context, ns, name string) (int32, bool) {
				v, ok := priorities[name]
				return v, ok && ns == "ml"
			}
			claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "c", UID: types.UID("uid-" + strings.NewReplacer(" ", "-", ":", "").Replace(tt.name))}}
			claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
				Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: nodeName, Device: tt.device}}}}
			for _, pod := range tt.pods {
				claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: pod, UID: types.UID(pod)})
			}
			if err := prepareOne(t.Context(), p, claim); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(dra.CDISpecPath(dirs.cdi, claim.UID))
			if err != nil {
				t.Fatal(err)
			}
			spec := string(b)
			for _, w := range tt.want {
				if !strings.Contains(spec, `"`+w+`"`) {
					t.Errorf("the CDI spec lacks %s:\n%s", w, spec)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(spec, a) {
					t.Errorf("the CDI spec sets %s:\n%s", a, spec)
				}
			}
		})
	}
}
