package nvmlmock

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// writeProc makes procRoot/<pid>/environ hold env.
func writeProc(t *testing.T, root, pid string, env ...string) {
	t.Helper()
	dir := filepath.Join(root, pid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func pids(ps []nvml.ProcessInfo) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for _, p := range ps {
		out[p.Pid] = p.UsedGpuMemory
	}
	return out
}

func TestHostProcessesDeclaringSimulatedUseAreListedOnTheirGPUs(t *testing.T) {
	srv := NewH100(4)
	g0, g1, g3 := srv.GPUs[0], srv.GPUs[1], srv.GPUs[3]
	g3.SetProcesses(4242) // set another way: a scan that finds nothing for GPU 3 leaves it
	root := t.TempDir()
	writeProc(t, root, "100", "NVIDIA_VISIBLE_DEVICES="+g0.Device.UUID, EnvSimulatedMemoryMiB+"=2048", EnvSimulatedSMPercent+"=40")
	writeProc(t, root, "200", "NVIDIA_VISIBLE_DEVICES="+g0.Device.UUID, EnvSimulatedMemoryMiB+"=1024", "CUDA_MPS_PIPE_DIRECTORY=/mps")
	writeProc(t, root, "300", "CUDA_VISIBLE_DEVICES="+g1.Device.UUID+","+g0.Device.UUID, EnvSimulatedMemoryMiB+"=512")
	writeProc(t, root, "400", "NVIDIA_VISIBLE_DEVICES="+g1.Device.UUID) // declares nothing
	writeProc(t, root, "500", "NVIDIA_VISIBLE_DEVICES="+g1.Device.UUID, EnvSimulatedMemoryMiB+"=lots")
	writeProc(t, root, "600", "NVIDIA_VISIBLE_DEVICES=GPU-not-here", EnvSimulatedMemoryMiB+"=1")
	writeProc(t, root, "self", EnvSimulatedMemoryMiB+"=1") // not a pid
	if err := srv.ScanHostProcesses(root); err != nil {
		t.Fatal(err)
	}

	compute, ret := g0.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if got, want := pids(compute), map[uint32]uint64{100: 2048 << 20, 300: 512 << 20}; !maps.Equal(got, want) {
		t.Errorf("GPU 0 compute processes %v, want %v", got, want)
	}
	mps, ret := g0.GetMPSComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if got, want := pids(mps), map[uint32]uint64{200: 1024 << 20}; !maps.Equal(got, want) {
		t.Errorf("GPU 0 MPS clients %v, want %v", got, want)
	}
	if got, _ := g1.GetComputeRunningProcesses(); !maps.Equal(pids(got), map[uint32]uint64{300: 512 << 20}) {
		t.Errorf("GPU 1 compute processes %v, want only pid 300", pids(got))
	}
	if got, _ := g3.GetComputeRunningProcesses(); len(got) != 1 || got[0].Pid != 4242 {
		t.Errorf("GPU 3 processes %v: the scan changed a GPU it found nothing for", pids(got))
	}
	g0.AdvanceSamples(1_000_000)
	samples, ret := g0.GetProcessUtilization(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if len(samples) != 1 || samples[0].Pid != 100 || samples[0].SmUtil != 40 {
		t.Errorf("GPU 0 utilization samples %+v, want one for pid 100 at 40%%", samples)
	}

	// The processes end: their GPUs are idle at the next scan.
	for _, pid := range []string{"100", "200", "300"} {
		if err := os.RemoveAll(filepath.Join(root, pid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.ScanHostProcesses(root); err != nil {
		t.Fatal(err)
	}
	for i, g := range []*GPU{g0, g1} {
		c, _ := g.GetComputeRunningProcesses()
		m, _ := g.GetMPSComputeRunningProcesses()
		if len(c)+len(m) != 0 {
			t.Errorf("GPU %d still lists %v and %v after its processes ended", i, pids(c), pids(m))
		}
	}
}

func TestHostProcessesOnAMIGDeviceAreListedOnItsInstance(t *testing.T) {
	srv := NewH100(1)
	g := srv.GPUs[0]
	root := t.TempDir()
	uuid := "MIG-" + strings.TrimPrefix(g.Device.UUID, "GPU-") + "-gi2-ci0"
	writeProc(t, root, "700", "NVIDIA_VISIBLE_DEVICES="+uuid, EnvSimulatedMemoryMiB+"=300")
	if err := srv.ScanHostProcesses(root); err != nil {
		t.Fatal(err)
	}
	ps, _ := g.GetComputeRunningProcesses()
	if len(ps) != 1 || ps[0].Pid != 700 || ps[0].GpuInstanceId != 2 || ps[0].ComputeInstanceId != 0 {
		t.Errorf("processes %+v, want pid 700 on GPU instance 2, compute instance 0", ps)
	}
}
