package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin is a client of one plugin endpoint, as the kubelet's device manager uses it.
type Plugin struct {
	pluginapi.DevicePluginClient
	conn *grpc.ClientConn
}

func dial(path string) (*Plugin, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", path, err)
	}
	return &Plugin{DevicePluginClient: pluginapi.NewDevicePluginClient(conn), conn: conn}, nil
}

// Dial connects to the endpoint of resource's latest registration.
func (k *Kubelet) Dial(resource string) (*Plugin, error) {
	regs := k.Registrations(resource)
	if len(regs) == 0 {
		return nil, fmt.Errorf("%s never registered", resource)
	}
	return dial(filepath.Join(k.dir, regs[len(regs)-1].Endpoint))
}

// Close closes the connection.
func (p *Plugin) Close() { _ = p.conn.Close() }

// AllocateOne asks for one container with the given devices and returns its response.
func (p *Plugin) AllocateOne(ctx context.Context, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return nil, fmt.Errorf("allocate answered %d containers for 1", n)
	}
	return resp.ContainerResponses[0], nil
}

// Preferred asks for the preferred allocation of one container.
func (p *Plugin) Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	resp, err := p.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: int32(size),
	}}})
	if err != nil {
		return nil, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return nil, fmt.Errorf("preferred allocation answered %d containers for 1", n)
	}
	return resp.ContainerResponses[0].DeviceIDs, nil
}

// Watch is an open ListAndWatch stream; each list it receives is buffered.
type Watch struct {
	lists chan []*pluginapi.Device
	err   chan error
	last  []*pluginapi.Device
}

// Watch opens ListAndWatch and reads it until ctx ends or the stream does.
func (p *Plugin) Watch(ctx context.Context) (*Watch, error) {
	s, err := p.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	w := &Watch{lists: make(chan []*pluginapi.Device, 64), err: make(chan error, 1)}
	go func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				w.err <- err
				close(w.lists)
				return
			}
			w.lists <- resp.Devices
		}
	}()
	return w, nil
}

// ErrStreamEnded is returned once the plugin has closed the stream and every list was read.
var ErrStreamEnded = errors.New("ListAndWatch stream ended")

// Next returns the next list the plugin sent.
func (w *Watch) Next(ctx context.Context) ([]*pluginapi.Device, error) {
	select {
	case l, ok := <-w.lists:
		if !ok {
			return nil, fmt.Errorf("%w: %v", ErrStreamEnded, <-w.err)
		}
		w.last = l
		return l, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a device list (last: %v): %w", Health(w.last), ctx.Err())
	}
}

// WaitFor reads lists until one satisfies ok and returns it.
func (w *Watch) WaitFor(ctx context.Context, ok func(map[string]string) bool) (map[string]string, error) {
	for {
		l, err := w.Next(ctx)
		if err != nil {
			return nil, err
		}
		if h := Health(l); ok(h) {
			return h, nil
		}
	}
}

// Health maps device ID to health.
func Health(devs []*pluginapi.Device) map[string]string {
	out := make(map[string]string, len(devs))
	for _, d := range devs {
		out[d.ID] = d.Health
	}
	return out
}
