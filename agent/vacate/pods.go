package vacate

import (
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/deviceid"
	"github.com/gpusharing/gpusharing/agent/podres"
)

// DefaultPodResourcesSocket is where the kubelet serves the PodResources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// listTimeout bounds one List call to the kubelet.
const listTimeout = 10 * time.Second

// PodResourcesLister is the part of the kubelet's PodResources v1 API Vacate uses; the generated
// client satisfies it.
type PodResourcesLister = podres.Lister

// DialPodResources connects to the kubelet's PodResources socket. The connection is lazy: a kubelet
// that is down shows as a List error, which Vacate retries.
func DialPodResources(socketPath string) (podresourcesv1.PodResourcesListerClient, func() error, error) {
	conn, err := grpc.NewClient("unix://"+socketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: dialing %s: %v", ErrPodResourcesUnavailable, socketPath, err)
	}
	return podresourcesv1.NewPodResourcesListerClient(conn), conn.Close, nil
}

// ClaimHolders finds the pods that hold DRA ResourceClaims allocated devices of a GPU.
type ClaimHolders interface {
	// PodsHoldingGPU lists the pods a claim on the GPU of index (or one of its MIG instances) is
	// reserved for; with a scope, only those of the claims it names.
	PodsHoldingGPU(ctx context.Context, index int32, scope *ClaimScope) ([]PodRef, error)
}

// ClaimScope names the claims a change takes from a GPU: a fixed-layout change of a dynamic MIG GPU
// takes the claims whose instances its new fixed instances need (Claims) and the claims holding the
// fixed instances it destroys (Devices, published DRA device names), and no other claim's pod.
type ClaimScope struct {
	Claims  []types.UID
	Devices []string
}

// podsUsingGPU lists the pods the kubelet reports holding one of the GPU's devices and the pods
// holding claims on them, less those the API server says have ended.
func (r *run) podsUsingGPU(ctx context.Context) ([]PodRef, error) {
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	holders := map[PodRef]bool{}
	if r.v.PodResources != nil {
		resp, err := r.v.PodResources.List(lctx, &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrPodResourcesUnavailable, err)
		}
		ids := map[string]bool{r.req.GPUUUID: true}
		for _, m := range r.req.MIGUUIDs {
			ids[m] = true
		}
		for _, p := range resp.GetPodResources() {
			if holdsDevice(p, ids) {
				holders[PodRef{Namespace: p.GetNamespace(), Name: p.GetName()}] = true
			}
		}
	}
	if r.v.Claims != nil {
		pods, err := r.v.Claims.PodsHoldingGPU(lctx, r.req.GPUIndex, r.req.ClaimScope)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrClaimsUnavailable, err)
		}
		for _, p := range pods {
			holders[p] = true
		}
	}
	var out []PodRef
	for ref := range holders {
		ended, err := r.inspect(ctx, ref)
		if err != nil {
			// Could not check is not "ended": the pod still counts.
			ended = false
		}
		if !ended {
			out = append(out, ref)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// holdsDevice says whether any container of p holds a device of the GPU: the uuid itself, a replica
// <uuid>::<n>, or a MIG uuid, whatever the resource name.
func holdsDevice(p *podresourcesv1.PodResources, ids map[string]bool) bool {
	for d := range podres.OfPod(p) {
		if ids[deviceid.Parse(d.ID).UUID] {
			return true
		}
	}
	return false
}

// apiPod is what the API server said of a pod the kubelet lists: its uid (the eviction's precondition),
// whether it is bound to another node than Vacater.NodeName, and whether it is already being deleted.
type apiPod struct {
	uid       types.UID
	node      string
	elsewhere bool
	// terminating: the pod has a deletion timestamp (an eviction already went through, perhaps by an
	// agent process killed since); evicting it again would be a second disruption of the same pod.
	terminating bool
}

// inspect says whether the API server reports the pod gone or finished, and records its uid and node for
// the eviction.
func (r *run) inspect(ctx context.Context, ref PodRef) (bool, error) {
	if r.v.Pods == nil {
		return false, nil
	}
	var pod corev1.Pod
	if err := r.v.Pods.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}
	r.pods[ref] = apiPod{uid: pod.UID, node: pod.Spec.NodeName,
		elsewhere:   r.v.NodeName != "" && pod.Spec.NodeName != "" && pod.Spec.NodeName != r.v.NodeName,
		terminating: pod.DeletionTimestamp != nil}
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed, nil
}
