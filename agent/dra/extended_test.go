package dra_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/test/wait"
)

// A pod that asks only for an extended resource (no claim in its spec) on a node that advertises none:
// the real kube-scheduler v1.36.3 makes the claim of the DeviceClass naming the resource (config/dra),
// allocates it from the published slices and records it in the pod's status; the kubelet plugin
// prepares that claim like any other, and the container gets what the device plugin's Allocate gives
// for the same share.
func TestTheSchedulerServesExtendedResourcesThroughTheClassesAndThePluginPreparesThem(t *testing.T) {
	ctx, env := schedulingCluster(t)
	c := env.Client
	for _, tt := range []struct {
		pod, resource, want string
	}{
		{"ts", "gpusharing.io/gpu-timeslice", "gpu-3-timeslicing-"},
		{"whole", "nvidia.com/gpu", "gpu-5"},
		{"mig", "nvidia.com/mig-3g.40gb", "gpu-0-mig-0000-3g"},
		{"shared", "gpusharing.io/gpu-shared", "gpu-4-shared-"},
	} {
		t.Run(tt.pod, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: tt.pod},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "local/cuda:1",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(tt.resource): resource.MustParse("1")}}}}}}
			if err := c.Create(ctx, pod); err != nil {
				t.Fatal(err)
			}
			var claimName string
			wait.UntilState(t, 60*time.Second, func() (bool, string) {
				if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
					return false, err.Error()
				}
				st := pod.Status.ExtendedResourceClaimStatus
				if st == nil || pod.Spec.NodeName == "" {
					return false, fmt.Sprintf("node %q, extendedResourceClaimStatus %+v, conditions %+v", pod.Spec.NodeName, st, pod.Status.Conditions)
				}
				if len(st.RequestMappings) != 1 || st.RequestMappings[0].ContainerName != "c" || st.RequestMappings[0].ResourceName != tt.resource {
					return false, fmt.Sprintf("request mappings %+v", st.RequestMappings)
				}
				claimName = st.ResourceClaimName
				return true, ""
			}, "pod %s bound with a claim for %s", tt.pod, tt.resource)
			if got := allocated(t, ctx, c, claimName); !strings.HasPrefix(got, tt.want) {
				t.Errorf("the claim for %s got device %s, want %s*", tt.resource, got, tt.want)
			}
		})
	}

	// The kubelet plugin prepares the time-slice pod's claim: the container sees GPU 3, as Allocate
	// would give it, and no shim.
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "ts"}, &pod); err != nil {
		t.Fatal(err)
	}
	var claim resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: pod.Status.ExtendedResourceClaimStatus.ResourceClaimName}, &claim); err != nil {
		t.Fatal(err)
	}
	if len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != pod.UID {
		t.Fatalf("claim %s reserved for %+v, want the pod", claim.Name, claim.Status.ReservedFor)
	}
	dirs := newPluginDirs(t)
	kubelet, _ := startPlugin(t, env, dirs, true)
	resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Claims[string(claim.UID)]
	if got == nil || got.Error != "" || len(got.Devices) != 1 || len(got.Devices[0].CdiDeviceIds) != 1 {
		t.Fatalf("prepare = %+v", got)
	}
	envs, _ := container(t, dirs.cdi, got.Devices[0].CdiDeviceIds[0])
	const gpu3 = "GPU-00000003-0000-0000-0000-000000000000"
	if !slices.Contains(envs, "NVIDIA_VISIBLE_DEVICES="+gpu3) || slices.ContainsFunc(envs, func(e string) bool { return strings.HasPrefix(e, "LD_PRELOAD=") }) {
		t.Errorf("the time-slice pod's container env %v, want GPU 3 and no shim", envs)
	}
}
