package dra

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/devnodes/devnodestest"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// A claim's CDI spec carries its share's device nodes, and the container a runtime makes from it gets
// exactly those character devices, with the numbers the host's nodes have: the GPU's own node, the
// control and unified memory nodes, and a MIG instance's capability nodes, nothing of another GPU.
func TestClaimSpecsGiveTheContainerItsSharesDeviceNodes(t *testing.T) {
	h, err := devnodestest.Make(t.TempDir(), 8)
	if err != nil {
		t.Skipf("making device nodes needs CAP_MKNOD: %v", err)
	}
	cfg := share.Config{Nodes: h}.WithDefaults()
	status := sharetest.NodeStatus(
		sharetest.GPU(0, "GPU-a", sharetest.Minor(0), sharetest.MPS(2, 50, "", v1alpha1.MPSDaemonRunning)),
		sharetest.GPU(3, "GPU-b", sharetest.Minor(3), sharetest.MIGInstanceIDs("1g.10gb", "MIG-b", 11, 0)),
	)
	devs := share.DevicesFromStatus(status, cfg)
	ctl := []string{"/dev/nvidiactl 195:255", fmt.Sprintf("/dev/nvidia-uvm %d:0", devnodestest.UVMMajor), fmt.Sprintf("/dev/nvidia-uvm-tools %d:1", devnodestest.UVMMajor)}
	capNode := func(gi, ci int) string {
		m := devnodestest.MIGMinor(3, gi, ci)
		return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d %d:%d", m, devnodestest.CapsMajor, m)
	}
	for _, tt := range []struct {
		name string
		devs []share.Device
		want []string
	}{
		{"an MPS share", devs["gpusharing.io/gpu-mps"][:1], append(ctl, "/dev/nvidia0 195:0")},
		{"a MIG instance", devs["nvidia.com/mig-1g.10gb"], append(ctl, "/dev/nvidia3 195:3", capNode(11, -1), capNode(11, 0))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := share.ContainerEdits(cfg, tt.devs)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			specs, err := newCDISpecs(dir)
			if err != nil {
				t.Fatal(err)
			}
			claim := types.UID("c0ffee")
			spec, err := newCDISpec([]cdispec.Device{{Name: cdiDeviceName(claim, "gpu"), ContainerEdits: cdiEditsOf(resp)}})
			if err != nil {
				t.Fatal(err)
			}
			if err := specs.write(claim, &spec); err != nil {
				t.Fatal(err)
			}
			cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			oci := &ocispec.Spec{Process: &ocispec.Process{}, Linux: &ocispec.Linux{}}
			if _, err := cache.InjectDevices(oci, CDIID(cdiDeviceName(claim, "gpu"))); err != nil {
				t.Fatalf("injecting: %v (%v)", err, cache.GetErrors())
			}
			var got []string
			for _, d := range oci.Linux.Devices {
				if d.Type != "c" {
					t.Errorf("%s is of type %q", d.Path, d.Type)
				}
				got = append(got, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("container devices\n got %v\nwant %v", got, tt.want)
			}
			// The device cgroup allows those nodes read-write and nothing else the spec adds.
			if oci.Linux.Resources == nil || len(oci.Linux.Resources.Devices) != len(tt.want) {
				t.Fatalf("device cgroup rules %+v", oci.Linux.Resources)
			}
			for _, r := range oci.Linux.Resources.Devices {
				if !r.Allow || r.Access != "rw" {
					t.Errorf("device cgroup rule %+v", r)
				}
			}
			if filepath.Dir(spec.Devices[0].ContainerEdits.DeviceNodes[0].HostPath) != h.Dev {
				t.Errorf("host path %s is not under the dev root %s", spec.Devices[0].ContainerEdits.DeviceNodes[0].HostPath, h.Dev)
			}
		})
	}
}
