package podres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func pod(ns, name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{
		{Name: "a", Devices: devs[:1]}, {Name: "b", Devices: devs[1:]}}}
}

func devs(res string, ids ...string) *podresourcesv1.ContainerDevices {
	return &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: ids}
}

// Every id of every container of every pod comes once, with its pod and resource; a caller that stops
// early gets no more.
func TestDevicesYieldsEveryIDOfEveryContainer(t *testing.T) {
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		pod("ns1", "p1", devs("nvidia.com/gpu", "GPU-a"), devs("gpusharing.io/gpu-mps", "GPU-b::0", "GPU-b::1")),
		pod("ns2", "p2", devs("nvidia.com/mig-1g.10gb", "MIG-c")),
	}}
	var got []string
	for d := range Devices(resp) {
		got = append(got, strings.Join([]string{d.Namespace, d.Pod, d.Resource, d.ID}, " "))
	}
	want := []string{"ns1 p1 nvidia.com/gpu GPU-a", "ns1 p1 gpusharing.io/gpu-mps GPU-b::0",
		"ns1 p1 gpusharing.io/gpu-mps GPU-b::1", "ns2 p2 nvidia.com/mig-1g.10gb MIG-c"}
	if !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	n := 0
	for range Devices(resp) {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Fatalf("stopped after %d, want 2", n)
	}
}

type slowLister struct{}

func (slowLister) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest, _ ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A kubelet that does not answer costs its caller the timeout, and the error says what was asked.
func TestListIsBoundedByItsTimeout(t *testing.T) {
	_, err := List(context.Background(), slowLister{}, 10*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "listing the kubelet's pod resources") {
		t.Fatalf("err %v, want the deadline, saying what was listed", err)
	}
}
