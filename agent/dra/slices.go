package dra

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/deviceplugin"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Slices cuts a node's devices into ResourceSlices of one pool named after the node, at most
// ResourceSliceMaxDevices each (a node publishes at least one slice, empty when it offers nothing, so
// the scheduler sees the pool and its generation).
func Slices(node string, generation int64, devices []resourcev1.Device) []resourcev1.ResourceSlice {
	var chunks [][]resourcev1.Device
	for len(devices) > resourcev1.ResourceSliceMaxDevices {
		chunks = append(chunks, devices[:resourcev1.ResourceSliceMaxDevices])
		devices = devices[resourcev1.ResourceSliceMaxDevices:]
	}
	chunks = append(chunks, devices)
	out := make([]resourcev1.ResourceSlice, 0, len(chunks))
	for i, devs := range chunks {
		out = append(out, resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: SliceName(node, i)},
			Spec: resourcev1.ResourceSliceSpec{
				Driver:   DriverName,
				NodeName: &node,
				Pool:     resourcev1.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: int64(len(chunks))},
				Devices:  devs,
			},
		})
	}
	return out
}

// SliceName is the name of a node's i-th slice.
func SliceName(node string, i int) string { return fmt.Sprintf("%s-gpusharing-%d", node, i) }

// Publisher keeps one node's ResourceSlices equal to its devices.
type Publisher struct {
	Client client.Client
	Node   string
	// Owner is the Node object: its slices are garbage-collected with it.
	Owner *metav1.OwnerReference
}

// Sync writes the node's slices for devices: nothing when they already say it, else every slice with
// the pool's generation raised by one (the scheduler only mixes slices of one generation); slices past
// the new count are deleted.
func (p *Publisher) Sync(ctx context.Context, devices []resourcev1.Device) (changed bool, err error) {
	var have resourcev1.ResourceSliceList
	if err := p.Client.List(ctx, &have, client.MatchingFields{resourcev1.ResourceSliceSelectorNodeName: p.Node}); err != nil {
		// Field selectors need the API server; a cache without the index answers with an error.
		if err := p.Client.List(ctx, &have); err != nil {
			return false, fmt.Errorf("listing ResourceSlices: %w", err)
		}
	}
	current := map[string]*resourcev1.ResourceSlice{}
	var gen int64
	for i := range have.Items {
		s := &have.Items[i]
		if s.Spec.Driver != DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != p.Node {
			continue
		}
		current[s.Name] = s
		gen = max(gen, s.Spec.Pool.Generation)
	}
	want := Slices(p.Node, gen, devices)
	if sameSlices(current, want) {
		return false, nil
	}
	keep := map[string]bool{}
	for _, s := range Slices(p.Node, gen+1, devices) {
		keep[s.Name] = true
		if p.Owner != nil {
			s.OwnerReferences = []metav1.OwnerReference{*p.Owner}
		}
		if old, ok := current[s.Name]; ok {
			old.Spec = s.Spec
			old.OwnerReferences = s.OwnerReferences
			if err := p.Client.Update(ctx, old); err != nil {
				return true, fmt.Errorf("updating ResourceSlice %s: %w", s.Name, err)
			}
			continue
		}
		if err := p.Client.Create(ctx, &s); err != nil {
			return true, fmt.Errorf("creating ResourceSlice %s: %w", s.Name, err)
		}
	}
	for name, s := range current {
		if !keep[name] {
			if err := p.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
				return true, fmt.Errorf("deleting ResourceSlice %s: %w", name, err)
			}
		}
	}
	return true, nil
}

// sameSlices says whether the slices on the server already publish want (generation aside).
func sameSlices(current map[string]*resourcev1.ResourceSlice, want []resourcev1.ResourceSlice) bool {
	if len(current) != len(want) {
		return false
	}
	for _, w := range want {
		c, ok := current[w.Name]
		if !ok || c.Spec.Pool.ResourceSliceCount != w.Spec.Pool.ResourceSliceCount || !sameDevices(c.Spec.Devices, w.Spec.Devices) {
			return false
		}
	}
	return true
}

func sameDevices(a, b []resourcev1.Device) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	// Semantic: quantities read back from the server compare by value, not by their cached form.
	return equality.Semantic.DeepEqual(a, b)
}

// StatusPublisher publishes a node's status as slices: the agent's reconciler calls it with each status
// it computes, as it tells the device plugin. It reads and writes the API server only when the devices
// differ from what it last published (once after a start); the slices are owned by the Node, so they go
// with it.
type StatusPublisher struct {
	Publisher
	// Config names the shares as the device plugin does (replica counts of shim shares).
	Config deviceplugin.Config

	// published is what the last successful Sync wrote or found: a pass whose devices equal it costs
	// no API call (the reconciler calls on every pass and resync).
	published []resourcev1.Device
	synced    bool
}

// PublishStatus syncs the node's slices with the devices status offers.
func (p *StatusPublisher) PublishStatus(ctx context.Context, status v1alpha1.GPUNodeStatus) error {
	if p.Owner == nil {
		var n corev1.Node
		if err := p.Client.Get(ctx, client.ObjectKey{Name: p.Node}, &n); err != nil {
			return fmt.Errorf("reading Node %s to own its ResourceSlices: %w", p.Node, err)
		}
		p.Owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}
	}
	devices := Devices(status, p.Config)
	if p.synced && sameDevices(p.published, devices) {
		return nil
	}
	if _, err := p.Sync(ctx, devices); err != nil {
		p.synced = false
		return err
	}
	p.published, p.synced = devices, true
	return nil
}

// Driver is the agent's DRA side as the reconciler sees it (a node.SlicePublisher): each status goes to
// the kubelet plugin first, then to the slices, so a device the scheduler can allocate is one the plugin
// can prepare.
type Driver struct {
	Slices *StatusPublisher
	// Plugin is nil where the node publishes slices without serving the kubelet plugin (tests, the demo).
	Plugin *KubeletPlugin
}

// PublishStatus tells the plugin the status's shares and publishes them.
func (d *Driver) PublishStatus(ctx context.Context, status v1alpha1.GPUNodeStatus) error {
	if d.Plugin != nil {
		d.Plugin.Update(status)
	}
	return d.Slices.PublishStatus(ctx, status)
}
