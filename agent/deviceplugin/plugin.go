package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpusharing/gpusharing/agent/owner"
	"github.com/gpusharing/gpusharing/agent/share"
)

// stopGrace bounds how long a stopping server waits for its ListAndWatch streams to send their last list.
const stopGrace = 2 * time.Second

// plugin is the gRPC server of one resource. Its device list changes in place (health, through
// ListAndWatch); a change of the device set or kind is served by a new plugin (see Manager).
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource share.ResourceName
	cfg      share.Config
	socket   string
	log      logr.Logger

	mu      sync.Mutex
	devices []share.Device
	changed chan struct{} // closed and replaced on every update, waking every ListAndWatch stream
	streams int           // open ListAndWatch streams
	lost    bool          // the last open stream ended while the plugin was serving

	// topology ranks the GPUs a container's shares go to (GetPreferredAllocation); nil knows none.
	topology *topologySource
	// owners refuses devices of GPUs DRA holds and records the ones allocated; nil beside no DRA.
	owners *owner.Owners

	stop     chan struct{}
	stopOnce sync.Once
	server   *grpc.Server
	served   chan struct{}
}

// socketName is the plugin's socket file name in the kubelet's directory, derived from the resource so a
// restarted agent reuses it: nvidia.com/gpu -> gpusharing-nvidia.com_gpu.sock.
func socketName(resource share.ResourceName) string {
	return "gpusharing-" + strings.NewReplacer("/", "_", "+", ".").Replace(string(resource)) + ".sock"
}

func newPlugin(cfg share.Config, resource share.ResourceName, devices []share.Device, log logr.Logger) *plugin {
	return &plugin{
		resource: resource,
		cfg:      cfg,
		socket:   filepath.Join(cfg.SocketDir, socketName(resource)),
		log:      log.WithValues("resource", string(resource)),
		devices:  devices,
		changed:  make(chan struct{}),
		stop:     make(chan struct{}),
		served:   make(chan struct{}),
	}
}

// start listens on the plugin's socket and serves until stopped.
func (p *plugin) start() error {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", p.socket, err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", p.socket, err)
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() {
		defer close(p.served)
		if err := p.server.Serve(lis); err != nil {
			p.log.Error(err, "Device plugin server stopped")
		}
	}()
	return nil
}

// shutdown ends the ListAndWatch streams (each sends its last list first), stops the server and removes
// the socket. It is safe to call more than once.
func (p *plugin) shutdown() {
	p.stopOnce.Do(func() {
		close(p.stop)
		if p.server == nil {
			return
		}
		done := make(chan struct{})
		go func() { p.server.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(stopGrace):
			p.server.Stop()
		}
		<-p.served
		// Only our own socket: a restarted kubelet may already have removed it.
		_ = os.Remove(p.socket)
	})
}

// setDevices replaces the device list and wakes the ListAndWatch streams.
func (p *plugin) setDevices(devices []share.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = devices
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *plugin) snapshot() ([]share.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices, p.changed
}

func (p *plugin) streamOpened() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.streams++
	p.lost = false
}

// streamClosed notes a stream the kubelet ended. The kubelet drops a plugin whose stream ends and, when a
// resource re-registers, may drop the new client as the old stream ends (its runClient disconnects
// whatever client is current by then); either way the plugin has to register again to be used.
func (p *plugin) streamClosed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.streams--
	select {
	case <-p.stop:
	default:
		if p.streams == 0 {
			p.lost = true
		}
	}
}

// openStreams is how many ListAndWatch streams are open now.
func (p *plugin) openStreams() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streams
}

// takeLost says whether the kubelet let go of the plugin since the last call.
func (p *plugin) takeLost() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lost
	p.lost = false
	return l
}

// socketExists says whether the plugin's socket is still there; a restarting kubelet removes it.
func (p *plugin) socketExists() bool {
	_, err := os.Stat(p.socket)
	return err == nil
}

func apiDevices(devs []share.Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(devs))
	for _, d := range devs {
		h := pluginapi.Healthy
		if !d.Healthy {
			h = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: d.ID, Health: h})
	}
	return out
}

// GetDevicePluginOptions says the kubelet should ask for preferred allocations.
func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the device list now and after every change until the plugin stops.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	p.streamOpened()
	defer p.streamClosed()
	for {
		devs, changed := p.snapshot()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: apiDevices(devs)}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-p.stop:
			// A list set just before stopping (empty, for a resource that went away) still reaches the kubelet.
			if last, _ := p.snapshot(); !sameDevices(last, devs) {
				_ = s.Send(&pluginapi.ListAndWatchResponse{Devices: apiDevices(last)})
			}
			return nil
		case <-s.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation answers each container request with preferredAllocation.
func (p *plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	devs, _ := p.snapshot()
	topo := p.topology.get(logr.NewContext(ctx, p.log))
	devs = slices.DeleteFunc(slices.Clone(devs), func(d share.Device) bool { return d.Held })
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := preferredAllocation(devs, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()), topo)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers each container request with the env and mounts of its devices' kind.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	devs, _ := p.snapshot()
	byID := make(map[string]share.Device, len(devs))
	for _, d := range devs {
		byID[d.ID] = d
	}
	resp := &pluginapi.AllocateResponse{}
	var units []string
	for _, cr := range req.GetContainerRequests() {
		var picked []share.Device
		for _, id := range cr.GetDevicesIds() {
			d, ok := byID[id]
			if !ok {
				return nil, status.Errorf(codes.InvalidArgument, "%s: %v: %s", p.resource, ErrUnknownDevice, id)
			}
			if d.Held {
				return nil, status.Errorf(codes.InvalidArgument, "%s: %v: %s", p.resource, ErrCordonedDevice, id)
			}
			picked = append(picked, d)
			units = append(units, owner.UnitOf(d))
		}
		cresp, err := share.ContainerEdits(p.cfg, picked)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", p.resource, err)
		}
		if p.cfg.CDIDir != "" && len(cresp.Devices) > 0 {
			cresp.CdiDevices = cdiDevices(picked)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	if p.owners != nil {
		// Decided last, once nothing else can fail: a recorded allocation makes claims on its GPU wait.
		if err := p.owners.TakeForDevicePlugin(units); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "%s: %v", p.resource, err)
		}
	}
	p.log.V(1).Info("Allocated devices", "containers", len(resp.ContainerResponses))
	return resp, nil
}

// PreStartContainer is not requested (PreStartRequired is false); it does nothing.
func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// sameDevices compares two lists including health and whether a device is held on a cordoned GPU.
func sameDevices(a, b []share.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameSpec(a[i], b[i]) || a[i].Healthy != b[i].Healthy || a[i].Held != b[i].Held {
			return false
		}
	}
	return true
}

// sameSpec compares what a device is, ignoring its health.
func sameSpec(a, b share.Device) bool {
	if a.ID != b.ID || a.Kind != b.Kind || a.GPUUUID != b.GPUUUID || a.VisibleUUID != b.VisibleUUID ||
		a.MIGProfile != b.MIGProfile || a.ShimOversub != b.ShimOversub || (a.QoS == nil) != (b.QoS == nil) || a.GPUIndex != b.GPUIndex {
		return false
	}
	if (a.MPS == nil) != (b.MPS == nil) {
		return false
	}
	return a.MPS == nil || *a.MPS == *b.MPS
}

// sameSpecs says whether two device lists differ only in health.
func sameSpecs(a, b []share.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameSpec(a[i], b[i]) {
			return false
		}
	}
	return true
}
