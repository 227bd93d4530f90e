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
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kubelet does for a simulated node the part of a kubelet that DRA needs, so a user of the demo sees
// claims prepared and freed: it calls the agent's DRA kubelet plugin over its socket, as the kubelet
// does, to prepare the claims of each pod bound to the node (and marks the pod Running once they are),
// and, when a pod is deleted, to unprepare them before it removes the pod (no container runs, so there
// is nothing to wait for). kube-controller-manager's ResourceClaim controller then deallocates the
// pod's claims, which is what gives the scheduler their devices back.
type Kubelet struct {
	// Node is the node's name; Client reads and writes its pods and reads claims.
	Node   string
	Client client.Client
	// PluginDir is the agent's DRA plugin directory (the socket dra.sock).
	PluginDir string
	// Interval is how often the node's pods are looked at (default 250ms).
	Interval time.Duration
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

func (k *Kubelet) sync(ctx context.Context, plugin drapb.DRAPluginClient) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var pods corev1.PodList
	if err := k.Client.List(cctx, &pods); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != k.Node {
			continue
		}
		claims, err := k.claims(cctx, pod)
		if err != nil {
			continue
		}
		if pod.DeletionTimestamp != nil {
			if len(claims) > 0 {
				resp, err := plugin.NodeUnprepareResources(cctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
				if err != nil || failed(resp.Claims) != "" {
					continue
				}
			}
			if err := k.Client.Delete(cctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				continue
			}
			continue
		}
		if pod.Status.Phase == corev1.PodRunning || len(claims) < len(pod.Spec.ResourceClaims) {
			continue
		}
		resp, err := plugin.NodePrepareResources(cctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
		if err != nil {
			continue
		}
		phase, msg := corev1.PodRunning, ""
		for uid, r := range resp.Claims {
			if r.Error != "" {
				phase, msg = corev1.PodPending, fmt.Sprintf("claim %s: %s", uid, r.Error)
			}
		}
		if pod.Status.Phase == phase && pod.Status.Message == msg {
			continue
		}
		pod.Status.Phase, pod.Status.Message = phase, msg
		_ = k.Client.Status().Update(cctx, pod)
	}
	return nil
}

// claims are the pod's ResourceClaims that are allocated and reserved for it, as the kubelet names them
// to the plugin.
func (k *Kubelet) claims(ctx context.Context, pod *corev1.Pod) ([]*drapb.Claim, error) {
	var out []*drapb.Claim
	for _, pc := range pod.Spec.ResourceClaims {
		name := ""
		if pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		}
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == pc.Name && s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
			}
		}
		if name == "" {
			continue
		}
		var c resourcev1.ResourceClaim
		if err := k.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, &c); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		reserved := false
		for _, r := range c.Status.ReservedFor {
			reserved = reserved || r.UID == pod.UID
		}
		if c.Status.Allocation == nil || !reserved {
			continue
		}
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return out, nil
}

func failed[T interface{ GetError() string }](m map[string]T) string {
	for uid, r := range m {
		if r.GetError() != "" {
			return uid + ": " + r.GetError()
		}
	}
	return ""
}
