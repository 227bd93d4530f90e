package fakekubelet

import (
	"context"
	"fmt"
	"reflect"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// client is the kubelet's connection to one registered plugin.
type client struct {
	resource string
	plugin   *Plugin
	cancel   context.CancelFunc
	done     chan struct{}
}

func (c *client) close() {
	c.cancel()
	c.plugin.Close()
	<-c.done
}

// connect does what the kubelet's connectClient does: the new client replaces the resource's current one
// in the map (the old one is left running), the plugin must answer, and a ListAndWatch stream is opened
// before Register returns. When the stream ends, the client that is current for the resource by then is
// dropped, which may be a newer one than the stream's.
func (k *Kubelet) connect(ctx context.Context, resource, socket string) error {
	p, err := dial(socket)
	if err != nil {
		return err
	}
	if _, err := p.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		p.Close()
		return fmt.Errorf("plugin does not answer: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	stream, err := p.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		cancel()
		p.Close()
		return fmt.Errorf("ListAndWatch: %w", err)
	}
	c := &client{resource: resource, plugin: p, cancel: cancel, done: make(chan struct{})}
	k.mu.Lock()
	k.clients[resource] = c
	k.mu.Unlock()
	go func() {
		defer close(c.done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				break
			}
			k.mu.Lock()
			if k.clients[resource] == c {
				k.devices[resource] = resp.Devices
				k.notifyLocked()
			}
			k.mu.Unlock()
		}
		// The kubelet's runClient: disconnect whatever client is registered for the resource now.
		k.mu.Lock()
		cur := k.clients[resource]
		if cur != nil {
			delete(k.clients, resource)
			k.markUnhealthyLocked(resource)
		}
		k.mu.Unlock()
		if cur != nil && cur != c {
			cur.cancel()
			cur.plugin.Close()
		}
		cancel()
		p.Close()
	}()
	return nil
}

// markUnhealthyLocked is the kubelet's PluginDisconnected: the resource's devices stay, unhealthy.
func (k *Kubelet) markUnhealthyLocked(resource string) {
	var devs []*pluginapi.Device
	for _, d := range k.devices[resource] {
		devs = append(devs, &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy})
	}
	k.devices[resource] = devs
	k.notifyLocked()
}

// Disconnect drops the resource's client as the kubelet does when it loses a plugin: its stream and
// connection close and its devices turn unhealthy. A plugin must register again to be used.
func (k *Kubelet) Disconnect(resource string) {
	k.mu.Lock()
	c := k.clients[resource]
	delete(k.clients, resource)
	k.markUnhealthyLocked(resource)
	k.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// Connected says whether the kubelet holds a client for resource.
func (k *Kubelet) Connected(resource string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.clients[resource] != nil
}

// Devices is the kubelet's view of resource: device ID to health, from the latest list of its stream.
func (k *Kubelet) Devices(resource string) map[string]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return Health(k.devices[resource])
}

// WaitForDevices waits until the kubelet's view of resource equals want while a client is connected.
func (k *Kubelet) WaitForDevices(ctx context.Context, resource string, want map[string]string) error {
	for {
		k.mu.Lock()
		ch := k.changed
		got := Health(k.devices[resource])
		connected := k.clients[resource] != nil
		k.mu.Unlock()
		if connected && reflect.DeepEqual(got, want) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("kubelet's view of %s is %v (connected: %v), want %v: %w", resource, got, connected, want, ctx.Err())
		}
	}
}
