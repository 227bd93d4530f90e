package share

import (
	"fmt"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/devnodes"
)

// NodeReader reads the host's NVIDIA device nodes (devnodes.Host).
type NodeReader interface {
	GPU(minor int32) (devnodes.Node, error)
	Control() ([]devnodes.Node, error)
	MIG(gpuMinor, gi, ci int32) ([]devnodes.Node, error)
}

// DeviceNodes are the nodes a container with devs gets: the control and unified memory nodes, then per
// device its GPU's node and, for a MIG instance, its GPU and compute instance capability nodes, each
// once, in the order of devs. Nothing else of the node's GPUs reaches the container, whatever its
// NVIDIA_VISIBLE_DEVICES says: the runtime creates only these in its /dev, and its device cgroup
// allows only these.
func DeviceNodes(r NodeReader, devs []Device) ([]devnodes.Node, error) {
	out, err := r.Control()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, n := range out {
		seen[n.Path] = true
	}
	add := func(ns ...devnodes.Node) {
		for _, n := range ns {
			if !seen[n.Path] {
				seen[n.Path] = true
				out = append(out, n)
			}
		}
	}
	for _, d := range devs {
		ns, err := ShareNodes(r, d)
		if err != nil {
			return nil, err
		}
		add(ns...)
	}
	return out, nil
}

// ShareNodes are one device's own nodes, without the control ones: the GPU's node and, for a MIG
// instance, its capability nodes.
func ShareNodes(r NodeReader, d Device) ([]devnodes.Node, error) {
	if d.GPUMinor == nil {
		return nil, fmt.Errorf("%w: GPU %s reports no minor number", devnodes.ErrMissing, d.GPUUUID)
	}
	gpu, err := r.GPU(*d.GPUMinor)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: %w", d.GPUUUID, err)
	}
	out := []devnodes.Node{gpu}
	if d.Kind == KindMIG {
		caps, err := r.MIG(*d.GPUMinor, d.MIGGI, d.MIGCI)
		if err != nil {
			return nil, fmt.Errorf("MIG device %s: %w", d.VisibleUUID, err)
		}
		out = append(out, caps...)
	}
	return out, nil
}

// DeviceSpecs are the nodes as the device plugin API hands them to the kubelet, which has the runtime
// create each in the container with read-write access (a CUDA process opens them read-write) and no mknod.
func DeviceSpecs(nodes []devnodes.Node) []*pluginapi.DeviceSpec {
	out := make([]*pluginapi.DeviceSpec, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: n.HostPath, Permissions: "rw"})
	}
	return out
}

// CDIDeviceNodes are device specs as CDI device nodes: character devices the runtime creates at the same
// path in the container with the access the spec gives, reading each node's major and minor from the
// host's node when the container starts (as the NVIDIA container toolkit's own specs leave them out).
func CDIDeviceNodes(devs []*pluginapi.DeviceSpec) []*cdispec.DeviceNode {
	var out []*cdispec.DeviceNode
	for _, d := range devs {
		out = append(out, &cdispec.DeviceNode{Path: d.ContainerPath, HostPath: d.HostPath, Type: "c", Permissions: d.Permissions})
	}
	return out
}
