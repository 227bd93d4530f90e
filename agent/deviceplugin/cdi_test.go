package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpusharing/gpusharing/agent/devnodes/devnodestest"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
)

// Allocate hands each container its shares as device nodes twice over: the Devices field, which any
// runtime creates, and CDI devices of the spec the manager writes for the advertised GPUs and MIG
// instances, which a runtime with CDI applies. Either way the container gets its GPU's node, the control
// and unified memory nodes and a MIG instance's capability nodes, and no other GPU's node.
func TestAllocateHandsOutTheSharesDeviceNodesAsDevicesAndCDIDevices(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	h, err := devnodestest.Make(filepath.Join(dir, "host"), 8)
	if err != nil {
		t.Skipf("making device nodes needs CAP_MKNOD: %v", err)
	}
	k := startKubelet(t, dir)
	cfg := testConfig(dir)
	cfg.Nodes, cfg.CDIDir = h, filepath.Join(dir, "cdi")
	m := runManager(t, cfg)
	status := sharetest.NodeStatus(
		sharetest.GPU(0, "GPU-ex", sharetest.Minor(0), sharetest.Exclusive()),
		sharetest.GPU(1, "GPU-ts", sharetest.Minor(1), sharetest.TimeSliced(3)),
		sharetest.GPU(2, "GPU-mig", sharetest.Minor(2), sharetest.MIGInstanceIDs("1g.10gb", "MIG-a", 9, 0)),
		sharetest.GPU(3, "GPU-sh", sharetest.Minor(3), sharetest.Shim(250*time.Millisecond)),
		// The host lacks this GPU's node: its share is refused, the others are served.
		sharetest.GPU(4, "GPU-gone", sharetest.Minor(12), sharetest.Exclusive()),
	)
	if err := m.UpdateFromStatus(ctx, status); err != nil {
		t.Fatalf("Update: %v", err)
	}
	for _, res := range []string{resGPU, resTimeSlice, resMIG1g, resShared} {
		if _, err := k.WaitForRegistrations(ctx, res, 1); err != nil {
			t.Fatal(err)
		}
	}
	ctl := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
	capA := []string{
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", devnodestest.MIGMinor(2, 9, -1)),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", devnodestest.MIGMinor(2, 9, 0)),
	}
	for _, tc := range []struct {
		name, resource string
		ids            []string
		want, cdi      []string
	}{
		{"an exclusive GPU", resGPU, []string{"GPU-ex"}, append(ctl, "/dev/nvidia0"), []string{"gpusharing.io/device=GPU-ex"}},
		{"time-slice replicas of one GPU", resTimeSlice, []string{"GPU-ts::0", "GPU-ts::2"}, append(ctl, "/dev/nvidia1"), []string{"gpusharing.io/device=GPU-ts"}},
		{"a MIG instance", resMIG1g, []string{"MIG-a"}, append(ctl, append([]string{"/dev/nvidia2"}, capA...)...), []string{"gpusharing.io/device=MIG-a"}},
		{"a shim share", resShared, []string{"GPU-sh::1"}, append(ctl, "/dev/nvidia3"), []string{"gpusharing.io/device=GPU-sh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := dialPlugin(t, k, tc.resource).AllocateOne(ctx, tc.ids...)
			if err != nil {
				t.Fatalf("Allocate %v: %v", tc.ids, err)
			}
			var got, cdi []string
			for _, d := range resp.Devices {
				got = append(got, d.ContainerPath)
				if d.HostPath != filepath.Join(h.Dev, strings.TrimPrefix(d.ContainerPath, "/dev/")) || d.Permissions != "rw" {
					t.Errorf("device %+v", d)
				}
			}
			for _, c := range resp.CdiDevices {
				cdi = append(cdi, c.Name)
			}
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(cdi, tc.cdi) {
				t.Errorf("devices %v and CDI devices %v, want %v and %v", got, cdi, tc.want, tc.cdi)
			}
			// The runtime applies the CDI devices from the spec the manager wrote.
			if injected := injectCDI(t, cfg.CDIDir, cdi...); !reflect.DeepEqual(injected, tc.want) {
				t.Errorf("the CDI devices give the container %v, want %v", injected, tc.want)
			}
		})
	}
	if _, err := dialPlugin(t, k, resGPU).AllocateOne(ctx, "GPU-gone"); err == nil || !strings.Contains(err.Error(), "nvidia12 does not exist") {
		t.Errorf("Allocate of a GPU without its node: %v, want the missing node named", err)
	}
	// The spec follows the advertised devices: a GPU no longer advertised leaves it.
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-ex", sharetest.Minor(0), sharetest.Exclusive()))); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(cfg.CDIDir, CDISpecName))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "GPU-ts") || !strings.Contains(string(data), "GPU-ex") {
		t.Errorf("the spec after GPU-ts left: %s", data)
	}
}

// injectCDI applies CDI devices as a runtime does and lists the device nodes the container gets.
func injectCDI(t *testing.T, dir string, ids ...string) []string {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	oci := &ocispec.Spec{Process: &ocispec.Process{}, Linux: &ocispec.Linux{}}
	if _, err := cache.InjectDevices(oci, ids...); err != nil {
		t.Fatalf("injecting %v: %v (%v)", ids, err, cache.GetErrors())
	}
	var out []string
	for _, d := range oci.Linux.Devices {
		out = append(out, d.Path)
	}
	return out
}
