package share

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/devnodes"
	"github.com/gpusharing/gpusharing/agent/devnodes/devnodestest"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// fakeNodes makes a host with 8 GPUs' device nodes in a temporary directory (root only: mknod).
func fakeNodes(t *testing.T) devnodes.Host {
	t.Helper()
	h, err := devnodestest.Make(t.TempDir(), 8)
	if err != nil {
		t.Skipf("making device nodes needs CAP_MKNOD: %v", err)
	}
	return h
}

// Every share hands its container the control and unified memory nodes and its own GPU's node, and a
// MIG instance its GPU and compute instance capability nodes, and nothing of another GPU: the node of
// each GPU the container gets, read from the host with the majors and minors the driver gave them.
func TestEverySharesContainerGetsItsGPUsDeviceNodesOnly(t *testing.T) {
	h := fakeNodes(t)
	ctl := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
	status := sharetest.NodeStatus(
		sharetest.GPU(0, "GPU-excl", sharetest.Minor(0), sharetest.Exclusive()),
		sharetest.GPU(1, "GPU-ts", sharetest.Minor(1), sharetest.TimeSliced(4)),
		sharetest.GPU(2, "GPU-mps", sharetest.Minor(2), sharetest.MPS(4, 25, "", v1alpha1.MPSDaemonRunning)),
		sharetest.GPU(3, "GPU-shim", sharetest.Minor(3), sharetest.Shim(time.Second)),
		// The minor is not the index: the node is named by what NVML reports.
		sharetest.GPU(4, "GPU-mig", sharetest.Minor(6), sharetest.MIGInstanceIDs("1g.10gb", "MIG-a", 9, 0), sharetest.MIGInstanceIDs("3g.40gb", "MIG-b", 2, 0)),
		sharetest.GPU(5, "GPU-shim2", sharetest.Minor(5), sharetest.Shim(time.Second)),
		sharetest.GPU(7, "GPU-x1", sharetest.Minor(7), sharetest.Exclusive()),
	)
	cfg := Config{Nodes: h}
	devs := DevicesFromStatus(status, cfg)
	pick := func(res ResourceName, ids ...string) []Device {
		var out []Device
		for _, id := range ids {
			for _, d := range devs[res] {
				if d.ID == id {
					out = append(out, d)
				}
			}
		}
		if len(out) != len(ids) {
			t.Fatalf("devices %v of %s not advertised: %v", ids, res, devs[res])
		}
		return out
	}
	capA := []string{capPath(6, 9, -1), capPath(6, 9, 0)}
	for _, tt := range []struct {
		name string
		devs []Device
		want []string
	}{
		{"an exclusive GPU", pick("nvidia.com/gpu", "GPU-excl"), append(ctl, "/dev/nvidia0")},
		{"two exclusive GPUs", pick("nvidia.com/gpu", "GPU-excl", "GPU-x1"), append(ctl, "/dev/nvidia0", "/dev/nvidia7")},
		{"two time-slice replicas of one GPU", pick("gpusharing.io/gpu-timeslice", "GPU-ts::0", "GPU-ts::3"), append(ctl, "/dev/nvidia1")},
		{"an MPS share", pick("gpusharing.io/gpu-mps", "GPU-mps::1"), append(ctl, "/dev/nvidia2")},
		{"a shim share", pick("gpusharing.io/gpu-shared", "GPU-shim::0"), append(ctl, "/dev/nvidia3")},
		{"shim shares of two GPUs", pick("gpusharing.io/gpu-shared", "GPU-shim::0", "GPU-shim2::1"), append(ctl, "/dev/nvidia3", "/dev/nvidia5")},
		{"a MIG instance", pick("nvidia.com/mig-1g.10gb", "MIG-a"), append(ctl, append([]string{"/dev/nvidia6"}, capA...)...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := ContainerEdits(cfg, tt.devs)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range resp.Devices {
				got = append(got, d.ContainerPath)
				if d.HostPath != filepath.Join(h.Dev, d.ContainerPath[len("/dev/"):]) || d.Permissions != "rw" {
					t.Errorf("%s: host path %s, permissions %q", d.ContainerPath, d.HostPath, d.Permissions)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("device nodes %v, want %v", got, tt.want)
			}
			// The nodes are what the runtime reads; the variables stay for CUDA inside.
			if resp.Envs[EnvNvidiaVisibleDevices] == "" {
				t.Error("no NVIDIA_VISIBLE_DEVICES")
			}
		})
	}
	nodes, err := ShareNodes(h, pick("nvidia.com/mig-3g.40gb", "MIG-b")[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []devnodes.Node{
		{Path: "/dev/nvidia6", HostPath: filepath.Join(h.Dev, "nvidia6"), Major: devnodes.NvidiaMajor, Minor: 6},
		{Path: capPath(6, 2, -1), HostPath: filepath.Join(h.Dev, capPath(6, 2, -1)[len("/dev/"):]), Major: devnodestest.CapsMajor, Minor: devnodestest.MIGMinor(6, 2, -1)},
		{Path: capPath(6, 2, 0), HostPath: filepath.Join(h.Dev, capPath(6, 2, 0)[len("/dev/"):]), Major: devnodestest.CapsMajor, Minor: devnodestest.MIGMinor(6, 2, 0)},
	}
	if !reflect.DeepEqual(nodes, want) {
		t.Errorf("MIG 3g.40gb's nodes %+v, want %+v", nodes, want)
	}
}

func capPath(gpu, gi, ci int) string {
	return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", devnodestest.MIGMinor(gpu, gi, ci))
}

// A share whose node the host lacks, or whose GPU reports no minor number, is refused with the reason,
// never handed out as a variable alone.
func TestASharesMissingDeviceNodeIsRefused(t *testing.T) {
	h := fakeNodes(t)
	for _, tt := range []struct {
		name string
		gpu  v1alpha1.GPUStatus
	}{
		{"no minor number", sharetest.GPU(0, "GPU-a", sharetest.Exclusive())},
		{"no node for the minor", sharetest.GPU(0, "GPU-a", sharetest.Minor(12), sharetest.Exclusive())},
	} {
		devs := DevicesFromStatus(sharetest.NodeStatus(tt.gpu), Config{Nodes: h})["nvidia.com/gpu"]
		if _, err := ContainerEdits(Config{Nodes: h}, devs); !errors.Is(err, devnodes.ErrMissing) {
			t.Errorf("%s: %v, want %v", tt.name, err, devnodes.ErrMissing)
		}
	}
	broken := devnodes.Host{Dev: filepath.Join(t.TempDir(), "dev"), Proc: h.Proc}
	devs := DevicesFromStatus(sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.Minor(0), sharetest.Exclusive())), Config{})["nvidia.com/gpu"]
	if _, err := ContainerEdits(Config{Nodes: broken}, devs); !errors.Is(err, devnodes.ErrMissing) {
		t.Errorf("a host without /dev/nvidiactl: %v, want %v", err, devnodes.ErrMissing)
	}
}
