package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// The MPS daemons and the device plugin's mounts come from one root through one layout: a device plugin
// configured with another MPS root is refused rather than handing pods a pipe directory no daemon uses.
func TestDevicePluginAndMPSDaemonsShareOneMPSLayout(t *testing.T) {
	cfg, err := DevicePluginConfig(share.Config{}, "/run/gs/mps", "")
	if err != nil {
		t.Fatal(err)
	}
	daemons := mps.New(mps.Config{Root: "/run/gs/mps"})
	for _, uuid := range []string{"GPU-a", "GPU-b"} {
		if cfg.MPSPipeDir(uuid) != daemons.PipeDir(uuid) || cfg.MPSPipeDir(uuid) != hostpath.MPSPipeDir("/run/gs/mps", uuid) {
			t.Errorf("pipe dir of %s: device plugin %q, MPS daemon %q", uuid, cfg.MPSPipeDir(uuid), daemons.PipeDir(uuid))
		}
		if cfg.MPSLogDir(uuid) != daemons.LogDir(uuid) {
			t.Errorf("log dir of %s: device plugin %q, MPS daemon %q", uuid, cfg.MPSLogDir(uuid), daemons.LogDir(uuid))
		}
		if cfg.MPSShmDir(uuid) != daemons.ShmDir(uuid) {
			t.Errorf("/dev/shm of %s: device plugin %q, MPS daemon %q", uuid, cfg.MPSShmDir(uuid), daemons.ShmDir(uuid))
		}
	}
	if cfg.MPSShmDir("GPU-a") == cfg.MPSShmDir("GPU-b") {
		t.Errorf("two GPUs share the /dev/shm %q, want one each", cfg.MPSShmDir("GPU-a"))
	}
	if _, err := DevicePluginConfig(share.Config{MPSRoot: "/elsewhere"}, "/run/gs/mps", ""); err == nil {
		t.Error("a device plugin MPS root other than the daemons' was accepted")
	}
}

// (a) The agent registers with the kubelet exactly what its GPUNode status reports applied, per GPU
// mode; a strategy change re-registers.
func TestAgentRegistersWhatItsStatusReportsAndReRegistersOnAStrategyChange(t *testing.T) {
	n := startNode(t, 4)
	mpsGPU, migGPU, tsGPU, exGPU := n.uuid(0), n.uuid(1), n.uuid(2), n.uuid(3)
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: mpsGPU, Index: 0, Sharing: mpsSharing(4)},
		v1alpha1.GPUDesired{UUID: migGPU, Index: 1, Sharing: migSharing("1g.5gb", 3)},
		v1alpha1.GPUDesired{UUID: tsGPU, Index: 2, Sharing: timeSlicing(3)},
		v1alpha1.GPUDesired{UUID: exGPU, Index: 3, Sharing: exclusive()},
	)
	g := n.waitFor(t, "every GPU as desired", appliedAsDesired(mpsGPU, migGPU, tsGPU, exGPU))

	n.waitDevices(t, "MPS replicas", "gpusharing.io/gpu-mps", replicas(mpsGPU, 4, nil))
	n.waitDevices(t, "time-slice replicas", "gpusharing.io/gpu-timeslice", replicas(tsGPU, 3, nil))
	n.waitDevices(t, "the exclusive GPU", "nvidia.com/gpu", map[string]string{exGPU: "Healthy"})
	migs := map[string]string{}
	for _, in := range gpuState(g, migGPU).Applied.MIGInstances {
		migs[in.UUID] = "Healthy"
	}
	if len(migs) != 3 {
		t.Fatalf("status reports MIG instances %v, want 3 with uuids", gpuState(g, migGPU).Applied.MIGInstances)
	}
	n.waitDevices(t, "MIG instances from status", "nvidia.com/mig-1g.5gb", migs)

	// A pod's MPS mount is the directory the GPU's daemon really runs in (its pid file is there).
	plugin, err := n.kubelet.Dial("gpusharing.io/gpu-mps")
	if err != nil {
		t.Fatal(err)
	}
	defer plugin.Close()
	resp, err := plugin.AllocateOne(context.Background(), share.ReplicaID(mpsGPU, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Mounts) != 2 || resp.Mounts[1].ContainerPath != "/dev/shm" {
		t.Fatalf("MPS allocation mounts %v, want the pipe directory and the GPU's /dev/shm", resp.Mounts)
	}
	pid, err := os.ReadFile(filepath.Join(resp.Mounts[0].HostPath, mps.PIDFile))
	if err != nil {
		t.Errorf("MPS mount %s is not the daemon's pipe directory: %v", resp.Mounts[0].HostPath, err)
	}
	if want := hostpath.MPSShmDir(filepath.Join(n.dir, "mps"), mpsGPU); resp.Mounts[1].HostPath != want {
		t.Errorf("MPS /dev/shm mount is %s, want the GPU's %s", resp.Mounts[1].HostPath, want)
	}
	// Where the harness runs daemons through the launcher (as root), the pod's /dev/shm is the one the
	// GPU's daemon sees: the same tmpfs.
	if n.isolatedMPS {
		var daemon, mount unix.Stat_t
		errD := unix.Stat(filepath.Join("/proc", strings.TrimSpace(string(pid)), "root/dev/shm"), &daemon)
		errM := unix.Stat(resp.Mounts[1].HostPath, &mount)
		if errD != nil || errM != nil || daemon.Dev != mount.Dev {
			t.Errorf("the MPS daemon's /dev/shm (device %d, %v) is not the pod's mount %s (device %d, %v)", daemon.Dev, errD, resp.Mounts[1].HostPath, mount.Dev, errM)
		}
	}

	// TimeSlicing -> MPS: the time-slice resource goes away and the MPS resource lists the GPU's new
	// replicas through its open stream, without registering again.
	regs := len(n.kubelet.Registrations("gpusharing.io/gpu-mps"))
	n.setSpec(t,
		v1alpha1.GPUDesired{UUID: mpsGPU, Index: 0, Sharing: mpsSharing(4)},
		v1alpha1.GPUDesired{UUID: migGPU, Index: 1, Sharing: migSharing("1g.5gb", 3)},
		v1alpha1.GPUDesired{UUID: tsGPU, Index: 2, Sharing: mpsSharing(2)},
		v1alpha1.GPUDesired{UUID: exGPU, Index: 3, Sharing: exclusive()},
	)
	n.waitFor(t, "GPU 2 on MPS", appliedAsDesired(tsGPU))
	n.waitDevices(t, "MPS replicas of both MPS GPUs", "gpusharing.io/gpu-mps", replicas(tsGPU, 2, replicas(mpsGPU, 4, nil)))
	n.waitDevices(t, "no time-slice replicas left", "gpusharing.io/gpu-timeslice", nil)
	if got := len(n.kubelet.Registrations("gpusharing.io/gpu-mps")); got != regs {
		t.Errorf("the MPS resource registered again after its devices changed (%d registrations, had %d)", got, regs)
	}
}

// Pods' GPUSHARE_SOCKET comes from the device plugin's scheduler root and the schedulers listen under the
// agent's: one root, through one layout, and a device plugin configured with another root is refused.
func TestDevicePluginNamesTheSocketTheShimSchedulersListenOn(t *testing.T) {
	cfg, err := DevicePluginConfig(share.Config{}, "/run/gs/mps", "/run/gs/sched")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.SchedulerSocketPath("GPU-a"), hostpath.SchedulerSocket("/run/gs/sched", "GPU-a"); got != want {
		t.Errorf("device plugin socket %q, schedulers listen on %q", got, want)
	}
	if _, err := DevicePluginConfig(share.Config{SchedulerRoot: "/elsewhere"}, "/run/gs/mps", "/run/gs/sched"); err == nil {
		t.Error("a device plugin scheduler root other than the schedulers' was accepted")
	}
}
