package testenv

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ReadyNode creates the Node name where it does not exist and writes it as its kubelet and the node
// lifecycle controller would, neither of which runs here: Ready, with room for pods, and without the
// not-ready taint the API server gives a new Node. The real kube-scheduler then places pods on it.
func (e *Env) ReadyNode(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if err := e.Client.Create(ctx, n); apierrors.IsAlreadyExists(err) {
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	n.Spec.Taints = nil
	if err := e.Client.Update(ctx, n); err != nil {
		return nil, err
	}
	room := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi")}
	n.Status.Capacity, n.Status.Allocatable = room, room
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := e.Client.Status().Update(ctx, n); err != nil {
		return nil, errors.Join(errors.New("writing the Node's status"), err)
	}
	return n, nil
}
