package simnode

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
)

// Kubelet does for a simulated node the part of a kubelet that DRA needs, so a user of the demo sees
// claims prepared and freed: it calls the agent's DRA kubelet plugin over its socket, as the kubelet
// does, to prepare the claims of each pod bound to the node (and marks the pod Running once they are),
// and, when a pod is deleted, finishes its deletion (no container runs, so there is nothing to wait
// for). Like the kubelet it unprepares a claim only once no pod left on the node uses it: pods may share
// a claim, and unpreparing it for the first one to go would take the device (a dynamic MIG instance,
// say) from under the others. kube-controller-manager's ResourceClaim controller then deallocates the
// claims no pod uses, which is what gives the scheduler their devices back.
type Kubelet struct {
	// Node is the node's name; Client reads and writes its pods and reads claims.
	Node   string
	Client client.Client
	// PluginDir is the agent's DRA plugin directory (the socket dra.sock).
	PluginDir string
	// Interval is how often the node's pods are looked at (default 250ms).
	Interval time.Duration
	// ProcRoot, when set, is the node's proc root where the containers that declare simulated use get a
	// process entry (podusage.go), with the env of their claims' CDI devices from CDIDir.
	ProcRoot, CDIDir string

	// prepared are the claims a prepare call named, by uid, until an unprepare call succeeds for them
	// (the kubelet's claim info cache); only Run's goroutine uses it.
	prepared map[types.UID]*drapb.Claim
	// procs are the simulated processes of the pods it runs; only Run's goroutine uses it.
	procs containers
}

// callTimeout bounds one call to the plugin or the API server.
const callTimeout = 10 * time.Second

// Run works until ctx ends.
func (k *Kubelet) Run(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.PluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	plugin := drapb.NewDRAPluginClient(conn)
	interval := k.Interval
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// Errors are retried on the next tick, as the kubelet retries.
		_ = k.sync(ctx, plugin)
	}
}

// sync admits the node's pods, unprepares the claims none of them uses any more, and finishes the
// deletion of the pods whose claims are unprepared or still used by others.
func (k *Kubelet) sync(ctx context.Context, plugin drapb.DRAPluginClient) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var pods corev1.PodList
	if err := k.Client.List(cctx, &pods); err != nil {
		return err
	}
	var list resourcev1.ResourceClaimList
	if err := k.Client.List(cctx, &list); err != nil {
		return err
	}
	claims := newClaimIndex(list.Items)
	inUse := map[types.UID]bool{}
	running := map[types.UID]bool{}
	var leaving []*corev1.Pod
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != k.Node {
			continue
		}
		if pod.DeletionTimestamp != nil {
			leaving = append(leaving, pod)
			continue
		}
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range claims.ofPod(pod) {
			inUse[c.UID] = true
		}
		k.admit(cctx, plugin, pod, claims)
		running[pod.UID] = true
	}
	k.stopContainers(running)
	pending := k.unprepareUnused(cctx, plugin, inUse)
	for _, pod := range leaving {
		if claims.anyOf(pod, pending) {
			continue
		}
		if err := k.Client.Delete(cctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			continue
		}
	}
	return nil
}

// admit prepares a pod's claims once every one of them is allocated and reserved for it, and writes
// the pod Running, or Pending with the plugin's error.
func (k *Kubelet) admit(ctx context.Context, plugin drapb.DRAPluginClient, pod *corev1.Pod, claims claimIndex) {
	ours, ready := claims.preparable(pod)
	if !ready {
		return
	}
	k.record(ours)
	if pod.Status.Phase == corev1.PodRunning {
		return
	}
	phase, msg := corev1.PodRunning, ""
	var cdiIDs []string
	if len(ours) > 0 {
		resp, err := plugin.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: ours})
		if err != nil {
			return
		}
		for uid, r := range resp.Claims {
			if r.Error != "" {
				phase, msg = corev1.PodPending, fmt.Sprintf("claim %s: %s", uid, r.Error)
			}
			for _, d := range r.Devices {
				cdiIDs = append(cdiIDs, d.CdiDeviceIds...)
			}
		}
	}
	if phase == corev1.PodRunning {
		if err := k.startContainers(pod, cdiIDs); err != nil {
			phase, msg = corev1.PodPending, "starting its containers: "+err.Error()
		}
	}
	if pod.Status.Phase == phase && pod.Status.Message == msg {
		return
	}
	setStatus(pod, phase, msg)
	_ = k.Client.Status().Update(ctx, pod)
}

// setStatus writes what the kubelet reports of a pod whose containers run (no process runs here), or
// of one that waits for its claims: the phase, the Ready conditions and the containers' states, so
// `kubectl wait --for=condition=Ready` and the READY column behave as on a real node.
func setStatus(pod *corev1.Pod, phase corev1.PodPhase, msg string) {
	now := metav1.Now()
	ready := corev1.ConditionFalse
	if phase == corev1.PodRunning {
		ready = corev1.ConditionTrue
	}
	pod.Status.Phase, pod.Status.Message = phase, msg
	if pod.Status.StartTime == nil {
		pod.Status.StartTime = &now
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	for _, t := range []corev1.PodConditionType{corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: ready, LastTransitionTime: now})
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: ready == corev1.ConditionTrue,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating", Message: msg}}}
		if cs.Ready {
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
			cs.Started = &cs.Ready
			cs.ContainerID = "containerd://" + containerID(pod.UID, c.Name)
		}
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, cs)
	}
}

// record adds claims to the prepared ones before they are prepared, as the kubelet does: a claim whose
// prepare failed halfway is unprepared too when its pods go.
func (k *Kubelet) record(claims []*drapb.Claim) {
	if k.prepared == nil {
		k.prepared = map[types.UID]*drapb.Claim{}
	}
	for _, c := range claims {
		k.prepared[types.UID(c.Uid)] = c
	}
}

// unprepareUnused unprepares the prepared claims that no pod on the node uses, and returns the uids of
// those still to unprepare (the call or that claim failed).
func (k *Kubelet) unprepareUnused(ctx context.Context, plugin drapb.DRAPluginClient, inUse map[types.UID]bool) map[types.UID]bool {
	var unused []*drapb.Claim
	pending := map[types.UID]bool{}
	for uid, c := range k.prepared {
		if !inUse[uid] {
			unused = append(unused, c)
			pending[uid] = true
		}
	}
	if len(unused) == 0 {
		return pending
	}
	resp, err := plugin.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: unused})
	if err != nil {
		return pending
	}
	for uid, r := range resp.Claims {
		if r.GetError() == "" {
			delete(k.prepared, types.UID(uid))
			delete(pending, types.UID(uid))
		}
	}
	return pending
}

// claimIndex holds the cluster's ResourceClaims by namespace and name.
type claimIndex map[types.NamespacedName]*resourcev1.ResourceClaim

func newClaimIndex(items []resourcev1.ResourceClaim) claimIndex {
	out := make(claimIndex, len(items))
	for i := range items {
		c := &items[i]
		out[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	return out
}

// claimNames are the names of the claims a pod uses, as the kubelet resolves them: its spec.resourceClaims
// (a template's claim through status.resourceClaimStatuses) and the claim the kube-scheduler made for
// its extended resources served through DRA (status.extendedResourceClaimStatus, KEP-5004). ok is false
// while a template's claim is not named yet.
func claimNames(pod *corev1.Pod) (out []string, ok bool) {
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			return nil, false
		}
		if name != nil {
			out = append(out, *name)
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		out = append(out, s.ResourceClaimName)
	}
	return out, true
}

// ofPod are the claims the pod names that exist.
func (ix claimIndex) ofPod(pod *corev1.Pod) []*resourcev1.ResourceClaim {
	named, _ := claimNames(pod)
	var out []*resourcev1.ResourceClaim
	for _, n := range named {
		if c := ix[types.NamespacedName{Namespace: pod.Namespace, Name: n}]; c != nil {
			out = append(out, c)
		}
	}
	return out
}

// anyOf says whether one of the pod's claims is in uids.
func (ix claimIndex) anyOf(pod *corev1.Pod, uids map[types.UID]bool) bool {
	for _, c := range ix.ofPod(pod) {
		if uids[c.UID] {
			return true
		}
	}
	return false
}

// preparable are the pod's claims with devices of the agent's driver, as the plugin is told them; ready
// is false until every claim the pod names exists, is allocated and is reserved for it (the kubelet
// refuses to start the pod before).
func (ix claimIndex) preparable(pod *corev1.Pod) (out []*drapb.Claim, ready bool) {
	named, ok := claimNames(pod)
	if !ok {
		return nil, false
	}
	for _, n := range named {
		c := ix[types.NamespacedName{Namespace: pod.Namespace, Name: n}]
		if c == nil || c.Status.Allocation == nil || !resourceclaim.IsReservedForPod(pod, c, false) {
			return nil, false
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == dra.DriverName {
				out = append(out, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
				break
			}
		}
	}
	return out, true
}
