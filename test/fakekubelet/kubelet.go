// Package fakekubelet is a kubelet for tests of device plugins and of code that reads PodResources: a
// Registration server on kubelet.sock that records each RegisterRequest and can restart the way a real
// kubelet does, a client for a registered plugin's endpoint, and a PodResources v1 server whose pod list
// the test sets.
package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// SocketName is the kubelet's registration socket in its device plugin directory.
const SocketName = "kubelet.sock"

// Kubelet serves the device plugin Registration service on <dir>/kubelet.sock. Like the kubelet's device
// manager, it connects to each registered plugin and keeps a ListAndWatch stream open, so Devices shows the
// kubelet's view of every resource; when that stream ends it drops whatever client is current for the
// resource, exactly as the kubelet's runClient does (see client.go).
type Kubelet struct {
	dir string

	mu       sync.Mutex
	requests []*pluginapi.RegisterRequest
	changed  chan struct{} // closed and replaced on every registration and device update
	server   *grpc.Server
	served   chan struct{}
	clients  map[string]*client
	devices  map[string][]*pluginapi.Device
	// dropNext counts, per resource, registrations to accept and then drop before their ListAndWatch
	// stream opens (DropNextRegistration).
	dropNext map[string]int
}

// Start serves the Registration service in dir. Keep dir short: a Unix socket path may not exceed 107 bytes.
func Start(dir string) (*Kubelet, error) {
	k := &Kubelet{dir: dir, changed: make(chan struct{}), clients: map[string]*client{}, devices: map[string][]*pluginapi.Device{}, dropNext: map[string]int{}}
	if err := k.serve(); err != nil {
		return nil, err
	}
	return k, nil
}

// Dir is the device plugin directory.
func (k *Kubelet) Dir() string { return k.dir }

// SocketPath is kubelet.sock's path.
func (k *Kubelet) SocketPath() string { return filepath.Join(k.dir, SocketName) }

func (k *Kubelet) serve() error {
	path := k.SocketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, &registration{k: k})
	served := make(chan struct{})
	k.mu.Lock()
	k.server, k.served = srv, served
	k.mu.Unlock()
	go func() { defer close(served); _ = srv.Serve(lis) }()
	return nil
}

// Stop ends the Registration server, closes every plugin connection and removes kubelet.sock.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	srv, served := k.server, k.served
	k.server = nil
	clients := k.clients
	k.clients = map[string]*client{}
	k.devices = map[string][]*pluginapi.Device{}
	k.mu.Unlock()
	for _, c := range clients {
		c.close()
	}
	if srv == nil {
		return
	}
	srv.Stop()
	<-served
	_ = os.Remove(k.SocketPath())
}

// Restart does what a restarting kubelet does to the directory: it stops, removes every socket in it
// (the plugins' included) and creates a new kubelet.sock. Recorded requests are kept.
func (k *Kubelet) Restart() error {
	k.Stop()
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return k.serve()
}

// Registrations returns the recorded requests for resource ("" for all), oldest first.
func (k *Kubelet) Registrations(resource string) []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*pluginapi.RegisterRequest
	for _, r := range k.requests {
		if resource == "" || r.ResourceName == resource {
			out = append(out, proto.Clone(r).(*pluginapi.RegisterRequest))
		}
	}
	return out
}

// WaitForRegistrations waits until resource has at least n recorded registrations and returns the latest.
func (k *Kubelet) WaitForRegistrations(ctx context.Context, resource string, n int) (*pluginapi.RegisterRequest, error) {
	for {
		k.mu.Lock()
		ch := k.changed
		k.mu.Unlock()
		if regs := k.Registrations(resource); len(regs) >= n {
			return regs[len(regs)-1], nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d registrations of %s (have %d): %w", n, resource, len(k.Registrations(resource)), ctx.Err())
		}
	}
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *Kubelet
}

// Register checks the request as the kubelet does (version, a reachable endpoint in the directory) and
// records it. Reaching the endpoint here pins that a plugin serves before it registers.
func (r *registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported device plugin API version %q", req.Version)
	}
	if req.ResourceName == "" || req.Endpoint == "" || filepath.Base(req.Endpoint) != req.Endpoint {
		return nil, fmt.Errorf("invalid registration: resource %q endpoint %q", req.ResourceName, req.Endpoint)
	}
	r.k.mu.Lock()
	drop := r.k.dropNext[req.ResourceName] > 0
	if drop {
		r.k.dropNext[req.ResourceName]--
		r.k.requests = append(r.k.requests, proto.Clone(req).(*pluginapi.RegisterRequest))
		r.k.notifyLocked()
	}
	r.k.mu.Unlock()
	if drop {
		return &pluginapi.Empty{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := r.k.connect(ctx, req.ResourceName, filepath.Join(r.k.dir, req.Endpoint)); err != nil {
		return nil, fmt.Errorf("endpoint %s of %s: %w", req.Endpoint, req.ResourceName, err)
	}
	r.k.mu.Lock()
	r.k.requests = append(r.k.requests, proto.Clone(req).(*pluginapi.RegisterRequest))
	r.k.notifyLocked()
	r.k.mu.Unlock()
	return &pluginapi.Empty{}, nil
}

// DropNextRegistration makes the next registration of resource succeed but never open its ListAndWatch
// stream, as the real kubelet 1.36 does when a re-registration races the old stream's end: its handler
// drops the new client before the stream reaches the plugin.
func (k *Kubelet) DropNextRegistration(resource string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropNext[resource]++
}

func (k *Kubelet) notifyLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}
