package share

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/share/sharetest"
)

// A sized shim share carries the shim's memory limit; several of one GPU in one container add up, and a
// fixed share (no limit) sets none, so a fixed-share container is unchanged.
func TestShimSharesCarryTheirMemoryLimitSummed(t *testing.T) {
	base := Device{Kind: KindShared, GPUUUID: "GPU-a", VisibleUUID: "GPU-a", Healthy: true}
	sized := func(limit int64) Device { d := base; d.Sized, d.MemoryLimitBytes = true, limit; return d }
	for _, tt := range []struct {
		name string
		devs []Device
		want string
	}{
		{"a fixed share", []Device{base}, ""},
		{"a sized share", []Device{sized(4 << 30)}, "4294967296"},
		{"two sized shares of one GPU", []Device{sized(4 << 30), sized(10 << 30)}, "15032385536"},
	} {
		resp, err := ContainerEdits(Config{}, tt.devs)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got, set := resp.Envs[EnvShimMemoryLimit]
		if got != tt.want || set != (tt.want != "") {
			t.Errorf("%s: %s=%q (set %v), want %q", tt.name, EnvShimMemoryLimit, got, set, tt.want)
		}
		if resp.Envs[EnvLDPreload] != ContainerShimLibrary {
			t.Errorf("%s: LD_PRELOAD=%q, want the shim", tt.name, resp.Envs[EnvLDPreload])
		}
	}
}

// No shim share, of a GPU with production classes or not, production or opportunistic, gets an idle
// window from its environment: on a GPU with classes the scheduler tells production processes theirs
// (the device plugin cannot tell the classes apart), and a window set here would make every
// opportunistic process hand the GPU, and on an oversubscribed GPU its memory, to the next one whenever
// it paused on the CPU for a millisecond.
func TestShimSharesLeaveTheIdleWindowToTheScheduler(t *testing.T) {
	m := DevicesFromStatus(sharetest.NodeStatus(
		sharetest.GPU(0, "GPU-a", sharetest.ShimBudget(time.Second, "40Gi"), sharetest.QoS(1000)),
		sharetest.GPU(1, "GPU-b", sharetest.ShimBudget(time.Second, "40Gi")),
	), Config{})
	for _, d := range m["gpusharing.io/gpu-shared"] {
		for _, opportunistic := range []bool{false, true} {
			d.Opportunistic = opportunistic
			resp, err := ContainerEdits(Config{}, []Device{d})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Envs[EnvShimSocket] == "" {
				t.Fatalf("%s: not a shim share: %v", d.ID, resp.Envs)
			}
			for _, env := range []string{EnvShimIdleMS, EnvShimIdleUS} {
				if got, set := resp.Envs[env]; set {
					t.Errorf("%s (opportunistic %v): %s=%q, want it left to the scheduler", d.ID, opportunistic, env, got)
				}
			}
		}
	}
}

// Shim shares of several GPUs in one container get the list form the shim reads (shim/src/config.c):
// each GPU's socket directory mounted under its uuid, and the socket, swapping and memory limit of each
// GPU as <uuid>=<value> pairs in CUDA_VISIBLE_DEVICES order, each socket path inside its own GPU's
// mount and each limit the sum of that GPU's sized shares.
func TestShimSharesOfTwoGPUsCarryEachGPUsSocketAndLimits(t *testing.T) {
	cfg := Config{SchedulerRoot: "/host/sched", ShimLibrary: "/host/libgpushare.so"}
	sizedB := func(n int32, limit int64) Device {
		return Device{ID: ReplicaID("GPU-b", n), Kind: KindShared, GPUUUID: "GPU-b", VisibleUUID: "GPU-b", ShimOversub: true, Sized: true, MemoryLimitBytes: limit}
	}
	a := Device{ID: "GPU-a::0", Kind: KindShared, GPUUUID: "GPU-a", VisibleUUID: "GPU-a"}
	resp, err := ContainerEdits(cfg, []Device{sizedB(0, 4<<30), a, sizedB(1, 2<<30)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		EnvNvidiaVisibleDevices: "GPU-b,GPU-a",
		EnvCUDAVisibleDevices:   "GPU-b,GPU-a",
		EnvLDPreload:            ContainerShimLibrary,
		EnvShimGPUUUID:          "GPU-b,GPU-a",
		EnvShimSocket:           "GPU-b=/var/run/gpusharing/scheduler/GPU-b/gpushare.sock,GPU-a=/var/run/gpusharing/scheduler/GPU-a/gpushare.sock",
		EnvShimOversub:          "GPU-b=1,GPU-a=0",
		EnvShimMemoryLimit:      "GPU-b=6442450944,GPU-a=0",
	}
	if !reflect.DeepEqual(resp.Envs, want) {
		t.Errorf("envs:\n got %v\nwant %v", resp.Envs, want)
	}
	var mounts []string
	for _, m := range resp.Mounts {
		mounts = append(mounts, fmt.Sprintf("%s<-%s ro=%v", m.ContainerPath, m.HostPath, m.ReadOnly))
	}
	wantMounts := []string{
		ContainerShimLibrary + "<-/host/libgpushare.so ro=true",
		"/var/run/gpusharing/scheduler/GPU-b<-/host/sched/GPU-b ro=true",
		"/var/run/gpusharing/scheduler/GPU-a<-/host/sched/GPU-a ro=true",
	}
	if !reflect.DeepEqual(mounts, wantMounts) {
		t.Errorf("mounts:\n got %v\nwant %v", mounts, wantMounts)
	}
	// No sized share: no limit variable at all, as for one GPU.
	resp, err = ContainerEdits(cfg, []Device{a, {ID: "GPU-b::0", Kind: KindShared, GPUUUID: "GPU-b", VisibleUUID: "GPU-b"}})
	if err != nil {
		t.Fatal(err)
	}
	if v, set := resp.Envs[EnvShimMemoryLimit]; set {
		t.Errorf("fixed shares of two GPUs: %s=%q, want it unset", EnvShimMemoryLimit, v)
	}
	if got, want := resp.Envs[EnvShimGPUUUID], "GPU-a,GPU-b"; got != want {
		t.Errorf("fixed shares of two GPUs: %s=%q, want %q", EnvShimGPUUUID, got, want)
	}
}

// What cannot work in one container is refused with a reason: MPS shares of two GPUs (one daemon and one
// /dev/shm per client), two fixed shim shares of one GPU (one lock client per GPU), also beside another
// GPU, and shim shares of more GPUs than the shim serves in one process. Sized shares of one GPU add up,
// as their memory does; shim shares of several GPUs, fixed or sized, get the list form; time-sliced
// replicas and whole GPUs span GPUs freely.
func TestContainerEditsRefuseSharesThatCannotWorkTogether(t *testing.T) {
	mpsOn := func(gpu string, n int32) Device {
		return Device{ID: ReplicaID(gpu, n), Kind: KindMPS, GPUUUID: gpu, VisibleUUID: gpu, MPS: &MPSLimits{ActiveThreadPercentage: 50}}
	}
	shimOn := func(gpu string, n int32) Device {
		return Device{ID: ReplicaID(gpu, n), Kind: KindShared, GPUUUID: gpu, VisibleUUID: gpu}
	}
	sized := func(d Device) Device {
		d.Sized, d.MemoryLimitBytes = true, 4<<30
		return d
	}
	on := func(kind Kind, gpu string, n int32) Device {
		return Device{ID: ReplicaID(gpu, n), Kind: kind, GPUUUID: gpu, VisibleUUID: gpu}
	}
	shimOnGPUs := func(n int) (devs []Device) {
		for i := range n {
			devs = append(devs, shimOn(fmt.Sprintf("GPU-%02d", i), 0))
		}
		return devs
	}
	for _, tt := range []struct {
		name string
		devs []Device
		want error
	}{
		{"MPS shares of two GPUs", []Device{mpsOn("GPU-a", 0), mpsOn("GPU-b", 0)}, ErrDevicesSpanGPUs},
		{"two fixed shim shares of one GPU", []Device{shimOn("GPU-a", 0), shimOn("GPU-a", 1)}, ErrSharesOnOneGPU},
		{"two fixed shim shares of one GPU beside another GPU", []Device{shimOn("GPU-a", 0), shimOn("GPU-b", 0), shimOn("GPU-a", 1)}, ErrSharesOnOneGPU},
		{"sized MPS shares of two GPUs", []Device{sized(mpsOn("GPU-a", 0)), sized(mpsOn("GPU-b", 0))}, ErrDevicesSpanGPUs},
		{"fixed shim shares of two GPUs", []Device{shimOn("GPU-a", 0), shimOn("GPU-b", 0)}, nil},
		{"sized shim shares of two GPUs", []Device{sized(shimOn("GPU-a", 0)), sized(shimOn("GPU-b", 0))}, nil},
		{"a fixed and a sized shim share of two GPUs", []Device{shimOn("GPU-a", 0), sized(shimOn("GPU-b", 0))}, nil},
		{"a fixed and a sized shim share of one GPU beside another GPU", []Device{shimOn("GPU-a", 0), sized(shimOn("GPU-a", 1)), shimOn("GPU-b", 0)}, nil},
		{"shim shares of as many GPUs as the shim serves", shimOnGPUs(MaxShimGPUs), nil},
		{"shim shares of one GPU more than the shim serves", shimOnGPUs(MaxShimGPUs + 1), ErrTooManyShimGPUs},
		{"two MPS shares of one GPU", []Device{mpsOn("GPU-a", 0), mpsOn("GPU-a", 1)}, nil},
		{"two sized shim shares of one GPU", []Device{sized(shimOn("GPU-a", 0)), sized(shimOn("GPU-a", 1))}, nil},
		{"time-sliced replicas of two GPUs", []Device{on(KindTimeSlicing, "GPU-a", 0), on(KindTimeSlicing, "GPU-b", 0)}, nil},
		{"whole GPUs", []Device{{ID: "GPU-a", Kind: KindExclusive, GPUUUID: "GPU-a", VisibleUUID: "GPU-a"}, {ID: "GPU-b", Kind: KindExclusive, GPUUUID: "GPU-b", VisibleUUID: "GPU-b"}}, nil},
	} {
		_, err := ContainerEdits(Config{}, tt.devs)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// The refusal of shim shares on more GPUs than the shim serves says how many and what a user can ask for
// instead, in the node's configured resource names.
func TestShimSharesOfTooManyGPUsSayWhatWorksInstead(t *testing.T) {
	cfg := Config{Resources: ResourceNames{TimeSlicing: "example.com/ts", Exclusive: "example.com/gpu"}}
	var devs []Device
	for i := range MaxShimGPUs + 1 {
		gpu := fmt.Sprintf("GPU-%02d", i)
		devs = append(devs, Device{ID: ReplicaID(gpu, 0), Kind: KindShared, GPUUUID: gpu, VisibleUUID: gpu})
	}
	_, err := ContainerEdits(cfg, devs)
	if !errors.Is(err, ErrTooManyShimGPUs) {
		t.Fatalf("got %v, want %v", err, ErrTooManyShimGPUs)
	}
	for _, want := range []string{"17 GPUs, at most 16", "several containers", "example.com/ts", "gpusharing-timeslicing", "example.com/gpu", "gpusharing-exclusive"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

// Tenants of one MPS GPU from different namespaces (DRA, which knows each claim's namespace) each get
// their own daemon's pipe directory and /dev/shm, and nothing of the other's: a container's MPS mounts
// are the only way it reaches a daemon and its shared memory. A share without a namespace (the device
// plugin's) gets the GPU's daemon.
func TestMPSEditsOfOneNamespaceNeverMountAnotherNamespacesDaemon(t *testing.T) {
	cfg := Config{MPSRoot: "/run/gpusharing/mps"}
	share := func(ns string, replica int32) Device {
		return Device{ID: ReplicaID("GPU-a", replica), Kind: KindMPS, GPUUUID: "GPU-a", VisibleUUID: "GPU-a",
			MPS: &MPSLimits{ActiveThreadPercentage: 50}, MPSNamespace: ns}
	}
	hostPaths := func(ns string, replica int32) map[string]string {
		t.Helper()
		resp, err := ContainerEdits(cfg, []Device{share(ns, replica)})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, m := range resp.Mounts {
			out[m.ContainerPath] = m.HostPath
		}
		if resp.Envs[EnvMPSPipeDirectory] != ContainerMPSPipeDir {
			t.Errorf("%s: %s=%q, want the mounted %s", ns, EnvMPSPipeDirectory, resp.Envs[EnvMPSPipeDirectory], ContainerMPSPipeDir)
		}
		return out
	}
	a, b, plugin := hostPaths("team-a", 0), hostPaths("team-b", 1), hostPaths("", 0)
	want := map[string]map[string]string{
		"team-a": {ContainerMPSPipeDir: "/run/gpusharing/mps/GPU-a/ns/team-a/pipe", ContainerShm: "/run/gpusharing/mps/GPU-a/ns/team-a/shm"},
		"team-b": {ContainerMPSPipeDir: "/run/gpusharing/mps/GPU-a/ns/team-b/pipe", ContainerShm: "/run/gpusharing/mps/GPU-a/ns/team-b/shm"},
		"":       {ContainerMPSPipeDir: "/run/gpusharing/mps/GPU-a/pipe", ContainerShm: "/run/gpusharing/mps/GPU-a/shm"},
	}
	for ns, got := range map[string]map[string]string{"team-a": a, "team-b": b, "": plugin} {
		if !reflect.DeepEqual(got, want[ns]) {
			t.Errorf("namespace %q mounts %v, want %v", ns, got, want[ns])
		}
	}
	for _, pa := range a {
		for _, pb := range b {
			if strings.HasPrefix(pb, pa) || strings.HasPrefix(pa, pb) {
				t.Errorf("team-b mounts %s, which reaches team-a's %s (or the other way round)", pb, pa)
			}
		}
		for _, pg := range plugin {
			if strings.HasPrefix(pa, pg) {
				t.Errorf("the GPU daemon's %s, which device plugin pods mount, holds team-a's %s", pg, pa)
			}
		}
	}
}
