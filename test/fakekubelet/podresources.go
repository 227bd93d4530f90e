package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources serves the kubelet's PodResourcesLister v1 with a pod list the test sets.
type PodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer

	path   string
	server *grpc.Server
	served chan struct{}

	mu    sync.Mutex
	pods  []*podresourcesv1.PodResources
	lists int
}

// StartPodResources serves on the Unix socket path.
func StartPodResources(path string) (*PodResources, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	s := &PodResources{path: path, server: grpc.NewServer(), served: make(chan struct{})}
	podresourcesv1.RegisterPodResourcesListerServer(s.server, s)
	go func() { defer close(s.served); _ = s.server.Serve(lis) }()
	return s, nil
}

// Path is the socket's path.
func (s *PodResources) Path() string { return s.path }

// Stop ends the server and removes the socket.
func (s *PodResources) Stop() {
	s.server.Stop()
	<-s.served
	_ = os.Remove(s.path)
}

// SetPods replaces the pod list.
func (s *PodResources) SetPods(pods ...*podresourcesv1.PodResources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = nil
	for _, p := range pods {
		s.pods = append(s.pods, proto.Clone(p).(*podresourcesv1.PodResources))
	}
}

// RemovePod drops namespace/name from the list, as the kubelet does once the pod's containers are gone.
func (s *PodResources) RemovePod(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.pods[:0]
	for _, p := range s.pods {
		if p.Namespace != namespace || p.Name != name {
			keep = append(keep, p)
		}
	}
	s.pods = keep
}

// Lists is how many List calls were served.
func (s *PodResources) Lists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// List returns the pod list.
func (s *PodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, p := range s.pods {
		resp.PodResources = append(resp.PodResources, proto.Clone(p).(*podresourcesv1.PodResources))
	}
	return resp, nil
}

// Pod builds a pod with one container holding deviceIDs of resource.
func Pod(namespace, name, resource string, deviceIDs ...string) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{
		Namespace: namespace,
		Name:      name,
		Containers: []*podresourcesv1.ContainerResources{{
			Name:    "main",
			Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: deviceIDs}},
		}},
	}
}
