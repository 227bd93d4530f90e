package simnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/dra"
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/setup"
	"github.com/gpusharing/gpusharing/test/simnode"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// kubeletNode is a simulated node with the agent's DRA plugin and the stand-in kubelet, its one H100
// time-sliced in two (devices gpu-0-timeslicing-0 and -1). Claims are allocated and reserved by the
// test as the kube-scheduler would, so each step is the test's own.
type kubeletNode struct {
	env  *testenv.Env
	name string
	// cdiDir is where the plugin writes a prepared claim's CDI spec and removes it on unprepare.
	cdiDir string
}

func startKubeletNode(t *testing.T, ctx context.Context) *kubeletNode {
	t.Helper()
	env := testenv.StartForTest(t)
	errs := make(chan error, 2)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Controllers(ctx, mgr, setup.Options{SkipNameValidation: true}); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			errs <- err
		}
	}()
	// os.MkdirTemp, not t.TempDir: the agent's Unix socket paths must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "simnode")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { simnode.StopDaemons(dir); _ = os.RemoveAll(dir) })
	n := simnode.Node{Name: "kubelet-node", Model: "H100", GPUs: 1, Labels: map[string]string{"pool": "kubelet"}, Seq: 11, DRAPlugin: true}
	if err := simnode.CreateNode(ctx, env.Client, n); err != nil {
		t.Fatal(err)
	}
	if err := simnode.Start(ctx, env.Config, env.Scheme, n, dir, errs); err != nil {
		t.Fatal(err)
	}
	p := &v1.GPUSharingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelet-timeslicing"},
		Spec: v1.GPUSharingPolicySpec{
			NodeSelector: &v1.NodeSelector{MatchLabels: map[string]v1.LabelValue{"pool": "kubelet"}},
			Sharing:      v1.Sharing{Strategy: v1.StrategyTimeSlicing, TimeSlicing: &v1.TimeSlicingSharing{Replicas: 2}},
		},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, time.Minute, func() (bool, string) {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		var slices resourcev1.ResourceSliceList
		if err := env.Client.List(ctx, &slices); err != nil {
			return false, err.Error()
		}
		var devices []string
		for _, s := range slices.Items {
			for _, d := range s.Spec.Devices {
				devices = append(devices, d.Name)
			}
		}
		for _, d := range devices {
			if d == "gpu-0-timeslicing-0" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("published %v", devices)
	}, "the node publishes its time-slice shares")
	return &kubeletNode{env: env, name: n.Name, cdiDir: filepath.Join(dir, n.Name, "cdi")}
}

// claim creates a claim of one time-slice request and allocates it the share device, as the
// kube-scheduler would.
func (k *kubeletNode) claim(t *testing.T, ctx context.Context, name, request, device string) *resourcev1.ResourceClaim {
	t.Helper()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: request,
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-timeslicing"}}}}}}
	if err := k.env.Client.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
		Request: request, Driver: dra.DriverName, Pool: k.name, Device: device}}}}
	if err := k.env.Client.Status().Update(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// reserve reserves the claim for the pods, as the kube-scheduler does before it binds them.
func (k *kubeletNode) reserve(t *testing.T, ctx context.Context, c *resourcev1.ResourceClaim, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	if err := k.env.Client.Status().Update(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// boundPod creates a pod bound to the node that uses the claim by name.
func (k *kubeletNode) boundPod(t *testing.T, ctx context.Context, name, claim string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: k.name,
			Containers:     []corev1.Container{{Name: "main", Image: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}}}
	if err := k.env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// prepared says whether the plugin holds the claim prepared: its CDI spec is written at prepare and
// removed at unprepare.
func (k *kubeletNode) prepared(t *testing.T, uid types.UID) bool {
	t.Helper()
	_, err := os.Stat(dra.CDISpecPath(k.cdiDir, uid))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func (k *kubeletNode) waitRunning(t *testing.T, ctx context.Context, pod *corev1.Pod) {
	t.Helper()
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		var p corev1.Pod
		if err := k.env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err.Error()
		}
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		return p.Status.Phase == corev1.PodRunning && ready, fmt.Sprintf("phase %s %s, conditions %v", p.Status.Phase, p.Status.Message, p.Status.Conditions)
	}, "pod %s Running and Ready", pod.Name)
}

// deleteAndWaitGone deletes the pod as a user does (the API server waits for the node to finish it)
// and waits until the stand-in kubelet has.
func (k *kubeletNode) deleteAndWaitGone(t *testing.T, ctx context.Context, pod *corev1.Pod) {
	t.Helper()
	if err := k.env.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		err := k.env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	}, "pod %s gone", pod.Name)
}

func TestTheStandInKubelet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := startKubeletNode(t, ctx)

	// The kubelet unprepares a claim only when no pod on the node uses it any more; unpreparing it when
	// the first of two pods goes destroys a dynamic MIG instance under the second.
	t.Run("keeps a shared claim prepared until its last pod goes", func(t *testing.T) {
		c := k.claim(t, ctx, "shared", "gpu", "gpu-0-timeslicing-0")
		first := k.boundPod(t, ctx, "first", c.Name)
		second := k.boundPod(t, ctx, "second", c.Name)
		k.reserve(t, ctx, c, first, second)
		k.waitRunning(t, ctx, first)
		k.waitRunning(t, ctx, second)
		if !k.prepared(t, c.UID) {
			t.Fatal("both pods Running, but their claim is not prepared")
		}
		// The stand-in unprepares what it must before it finishes a pod's deletion, so once the first pod
		// is gone the claim's state is final for this step.
		k.deleteAndWaitGone(t, ctx, first)
		if !k.prepared(t, c.UID) {
			t.Fatal("the first pod's deletion unprepared the claim the second pod still uses")
		}
		k.deleteAndWaitGone(t, ctx, second)
		if k.prepared(t, c.UID) {
			t.Fatal("the claim's last pod is gone, but the claim is still prepared")
		}
	})

	// KEP-5004: for a pod that asks an extended resource a DeviceClass serves, the kube-scheduler makes
	// a claim, reserves it for the pod and names it in status.extendedResourceClaimStatus; the kubelet
	// prepares it like the pod's own claims.
	t.Run("prepares the claim the scheduler made for an extended resource", func(t *testing.T) {
		const request = "container-0-request-0"
		// The scheduler's order: claim, reservation and pod status first, the binding last.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "extended"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "cuda", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"gpusharing.io/gpu-timeslice": resource.MustParse("1")}}}}}}
		if err := k.env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		c := k.claim(t, ctx, "extended-extended-resources-x1", request, "gpu-0-timeslicing-1")
		k.reserve(t, ctx, c, pod)
		pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: c.Name,
			RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: "main", ResourceName: "gpusharing.io/gpu-timeslice", RequestName: request}}}
		if err := k.env.Client.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: k.name}}
		if err := k.env.Client.SubResource("binding").Create(ctx, pod, binding); err != nil {
			t.Fatal(err)
		}
		k.waitRunning(t, ctx, pod)
		if !k.prepared(t, c.UID) {
			t.Fatal("the pod is Running, but the claim made for its extended resource is not prepared")
		}
		k.deleteAndWaitGone(t, ctx, pod)
		if k.prepared(t, c.UID) {
			t.Fatal("the pod is gone, but the claim made for its extended resource is still prepared")
		}
	})
}
