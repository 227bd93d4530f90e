// Package podres reads the kubelet's PodResources API: which devices of the device plugins the
// containers of each pod hold. The drain, the device plugin, the shim schedulers' admission and the
// arbiter between the device plugin and DRA all ask it the same question.
package podres

import (
	"context"
	"fmt"
	"iter"
	"time"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Lister is the part of the kubelet's PodResources v1 API that tells which devices pods hold; the
// generated client satisfies it.
type Lister interface {
	List(ctx context.Context, in *podresourcesv1.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error)
}

// List asks l once, bounded by timeout: a kubelet that does not answer must not hold up its caller.
func List(ctx context.Context, l Lister, timeout time.Duration) (*podresourcesv1.ListPodResourcesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := l.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing the kubelet's pod resources: %w", err)
	}
	return resp, nil
}

// Device is one device id a container of a pod holds.
type Device struct {
	Namespace, Pod string
	Resource       string
	ID             string
}

// Devices yields every device the pods of resp hold, container by container.
func Devices(resp *podresourcesv1.ListPodResourcesResponse) iter.Seq[Device] {
	return func(yield func(Device) bool) {
		for _, p := range resp.GetPodResources() {
			for d := range OfPod(p) {
				if !yield(d) {
					return
				}
			}
		}
	}
}

// OfPod yields the devices the containers of p hold.
func OfPod(p *podresourcesv1.PodResources) iter.Seq[Device] {
	return func(yield func(Device) bool) {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					if !yield(Device{Namespace: p.GetNamespace(), Pod: p.GetName(), Resource: d.GetResourceName(), ID: id}) {
						return
					}
				}
			}
		}
	}
}
