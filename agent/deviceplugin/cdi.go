package deviceplugin

import (
	"fmt"
	"reflect"
	"sort"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/share"
)

// The device plugin's CDI devices: one spec file of kind gpusharing.io/device with a device per GPU and
// per MIG instance the node advertises, named by its uuid, holding that GPU's or instance's device
// nodes and the control nodes. Allocate names the devices of a container's shares in CDIDevices, so a
// runtime with CDI on (containerd 1.7+, CRI-O) creates exactly those nodes in the container; Devices
// carries the same nodes for runtimes without CDI.
const (
	CDIVendor = "gpusharing.io"
	CDIClass  = "device"
	// CDISpecName is the spec file's name in the CDI directory.
	CDISpecName = CDIVendor + "-" + CDIClass + ".json"
)

// CDIDeviceID is the CDI device of a GPU or MIG instance: gpusharing.io/device=<uuid>.
func CDIDeviceID(uuid string) string { return parser.QualifiedName(CDIVendor, CDIClass, uuid) }

// cdiWriter writes the spec when the devices it describes change. The CDI cache validates it and writes
// through a temporary file and a rename, so a runtime reads the old spec or the new one.
type cdiWriter struct {
	cache *cdiapi.Cache
	last  *cdispec.Spec
}

func newCDIWriter(dir string) (*cdiWriter, error) {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("opening the CDI directory %s: %w", dir, err)
	}
	return &cdiWriter{cache: cache}, nil
}

// cdiSpec is the spec of devs: a CDI device per distinct uuid whose nodes r reads; a device whose nodes
// are missing is left out (its Allocate fails with the reason), so one GPU's missing node keeps no other
// GPU from its pods. missing says why each was left out.
func cdiSpec(r share.NodeReader, devs map[share.ResourceName][]share.Device) (spec *cdispec.Spec, missing []error, err error) {
	byUUID := map[string]share.Device{}
	for _, ds := range devs {
		for _, d := range ds {
			byUUID[d.VisibleUUID] = d
		}
	}
	names := make([]string, 0, len(byUUID))
	for n := range byUUID {
		names = append(names, n)
	}
	sort.Strings(names)
	spec = &cdispec.Spec{Kind: CDIVendor + "/" + CDIClass}
	for _, n := range names {
		nodes, err := share.DeviceNodes(r, []share.Device{byUUID[n]})
		if err != nil {
			missing = append(missing, err)
			continue
		}
		edits := cdispec.ContainerEdits{DeviceNodes: share.CDIDeviceNodes(share.DeviceSpecs(nodes))}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: n, ContainerEdits: edits})
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, missing, fmt.Errorf("the CDI version the spec needs: %w", err)
	}
	spec.Version = v
	return spec, missing, nil
}

// write writes spec unless it is the one last written; a spec without devices removes the file.
func (w *cdiWriter) write(spec *cdispec.Spec) error {
	if w.last != nil && reflect.DeepEqual(*w.last, *spec) {
		return nil
	}
	var err error
	if len(spec.Devices) == 0 {
		err = w.cache.RemoveSpec(CDISpecName)
	} else {
		err = w.cache.WriteSpec(spec, CDISpecName)
	}
	if err != nil {
		return fmt.Errorf("writing the device plugin's CDI spec: %w", err)
	}
	w.last = spec
	return nil
}

// cdiDevices names the CDI devices of a container's shares, each uuid once.
func cdiDevices(devs []share.Device) []*pluginapi.CDIDevice {
	var out []*pluginapi.CDIDevice
	seen := map[string]bool{}
	for _, d := range devs {
		if !seen[d.VisibleUUID] {
			seen[d.VisibleUUID] = true
			out = append(out, &pluginapi.CDIDevice{Name: CDIDeviceID(d.VisibleUUID)})
		}
	}
	return out
}
