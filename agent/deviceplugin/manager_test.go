package deviceplugin

import (
	"context"
	"errors"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/agent/share/sharetest"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
)

const (
	resGPU       = "nvidia.com/gpu"
	resTimeSlice = "gpusharing.io/gpu-timeslice"
	resMPS       = "gpusharing.io/gpu-mps"
	resShared    = "gpusharing.io/gpu-shared"
	resMIG1g     = "nvidia.com/mig-1g.10gb"
	resMIG3g     = "nvidia.com/mig-3g.40gb"
)

// socketDir makes a short directory: t.TempDir() paths can pass the 108-byte limit of a Unix socket path.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func testConfig(dir string) share.Config {
	return share.Config{
		SocketDir:           dir,
		MPSRoot:             "/host/run/mps",
		SchedulerRoot:       "/host/run/sched",
		ShimLibrary:         "/host/lib/libgpushare.so",
		KubeletPollInterval: 20 * time.Millisecond,
		RegisterTimeout:     2 * time.Second,
	}
}

func startKubelet(t *testing.T, dir string) *fakekubelet.Kubelet {
	t.Helper()
	k, err := fakekubelet.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// runManager starts a Manager's kubelet watch for the test's lifetime.
func runManager(t *testing.T, cfg share.Config) *Manager {
	t.Helper()
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dialPlugin(t *testing.T, k *fakekubelet.Kubelet, resource string) *fakekubelet.Plugin {
	t.Helper()
	p, err := k.Dial(resource)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func watch(t *testing.T, ctx context.Context, p *fakekubelet.Plugin) *fakekubelet.Watch {
	t.Helper()
	w, err := p.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func allHealthy(ids ...string) map[string]string {
	out := map[string]string{}
	for _, id := range ids {
		out[id] = pluginapi.Healthy
	}
	return out
}

// everyMode is a node with one GPU per mode.
func everyMode() v1alpha1.GPUNodeStatus {
	return sharetest.NodeStatus(
		sharetest.GPU(0, "GPU-ex", sharetest.Exclusive()),
		sharetest.GPU(1, "GPU-ts", sharetest.TimeSliced(3)),
		sharetest.GPU(2, "GPU-mps", sharetest.MPS(2, 40, "8Gi", "Running")),
		sharetest.GPU(3, "GPU-mig", sharetest.MIGInstance("1g.10gb", "MIG-a"), sharetest.MIGInstance("1g.10gb", "MIG-b"), sharetest.MIGInstance("3g.40gb", "MIG-c")),
		sharetest.GPU(4, "GPU-sh", sharetest.Shim(250*time.Millisecond)),
		sharetest.GPU(5, "GPU-ov", sharetest.TimeSliced(2), sharetest.ShimBudget(time.Second, "8Gi")),
	)
}

func TestManagerRegistersServesAndAllocatesEveryMode(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, everyMode()); err != nil {
		t.Fatalf("Update: %v", err)
	}

	wantLists := map[string]map[string]string{
		resGPU:       allHealthy("GPU-ex"),
		resTimeSlice: allHealthy("GPU-ts::0", "GPU-ts::1", "GPU-ts::2"),
		resMPS:       allHealthy("GPU-mps::0", "GPU-mps::1"),
		resMIG1g:     allHealthy("MIG-a", "MIG-b"),
		resMIG3g:     allHealthy("MIG-c"),
		resShared:    allHealthy("GPU-sh::0", "GPU-sh::1", "GPU-sh::2", "GPU-sh::3", "GPU-ov::0", "GPU-ov::1"),
	}
	for res, want := range wantLists {
		reg, err := k.WaitForRegistrations(ctx, res, 1)
		if err != nil {
			t.Fatal(err)
		}
		if reg.Version != pluginapi.Version || reg.Endpoint != socketName(share.ResourceName(res)) || !reg.GetOptions().GetGetPreferredAllocationAvailable() || reg.GetOptions().GetPreStartRequired() {
			t.Errorf("%s: registration %+v: want version %s, endpoint %s, preferred allocation on, pre-start off", res, reg, pluginapi.Version, socketName(share.ResourceName(res)))
		}
		if err := k.WaitForDevices(ctx, res, want); err != nil {
			t.Errorf("kubelet's view: %v", err)
		}
		w := watch(t, ctx, dialPlugin(t, k, res))
		got, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if h := fakekubelet.Health(got); !reflect.DeepEqual(h, want) {
			t.Errorf("%s: ListAndWatch sent %v, want %v", res, h, want)
		}
	}
	if n := len(k.Registrations("")); n != len(wantLists) {
		t.Errorf("got %d registrations, want one per resource (%d)", n, len(wantLists))
	}

	cases := []struct {
		name       string
		resource   string
		ids        []string
		wantEnvs   map[string]string
		wantMounts []*pluginapi.Mount
	}{
		{
			name: "exclusive GPU names the GPU", resource: resGPU, ids: []string{"GPU-ex"},
			wantEnvs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-ex", "CUDA_VISIBLE_DEVICES": "GPU-ex"},
		},
		{
			name: "time-slice replicas of one GPU name it once", resource: resTimeSlice, ids: []string{"GPU-ts::0", "GPU-ts::2"},
			wantEnvs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-ts", "CUDA_VISIBLE_DEVICES": "GPU-ts"},
		},
		{
			name: "an MPS share mounts the GPU's pipe directory and its own /dev/shm and sets the client limits", resource: resMPS, ids: []string{"GPU-mps::1"},
			wantEnvs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":            "GPU-mps",
				"CUDA_VISIBLE_DEVICES":              "GPU-mps",
				"CUDA_MPS_PIPE_DIRECTORY":           "/var/run/gpusharing/mps",
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=8192M",
			},
			wantMounts: []*pluginapi.Mount{{ContainerPath: "/var/run/gpusharing/mps", HostPath: "/host/run/mps/GPU-mps/pipe", ReadOnly: false}, {ContainerPath: "/dev/shm", HostPath: "/host/run/mps/GPU-mps/shm"}},
		},
		{
			name: "two MPS shares of one GPU add their limits up", resource: resMPS, ids: []string{"GPU-mps::0", "GPU-mps::1"},
			wantEnvs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":            "GPU-mps",
				"CUDA_VISIBLE_DEVICES":              "GPU-mps",
				"CUDA_MPS_PIPE_DIRECTORY":           "/var/run/gpusharing/mps",
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "80",
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=16384M",
			},
			wantMounts: []*pluginapi.Mount{{ContainerPath: "/var/run/gpusharing/mps", HostPath: "/host/run/mps/GPU-mps/pipe", ReadOnly: false}, {ContainerPath: "/dev/shm", HostPath: "/host/run/mps/GPU-mps/shm"}},
		},
		{
			name: "MIG instances name the MIG uuids", resource: resMIG1g, ids: []string{"MIG-a", "MIG-b"},
			wantEnvs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "MIG-a,MIG-b", "CUDA_VISIBLE_DEVICES": "MIG-a,MIG-b"},
		},
		{
			name: "a shim share preloads the shim and mounts the GPU's scheduler socket directory", resource: resShared, ids: []string{"GPU-sh::2"},
			wantEnvs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES": "GPU-sh",
				"CUDA_VISIBLE_DEVICES":   "GPU-sh",
				"LD_PRELOAD":             "/usr/lib/gpusharing/libgpushare.so",
				"GPUSHARE_SOCKET":        "/var/run/gpusharing/scheduler/gpushare.sock",
				"GPUSHARE_GPU_UUID":      "GPU-sh",
			},
			wantMounts: []*pluginapi.Mount{
				{ContainerPath: "/usr/lib/gpusharing/libgpushare.so", HostPath: "/host/lib/libgpushare.so", ReadOnly: true},
				{ContainerPath: "/var/run/gpusharing/scheduler", HostPath: "/host/run/sched/GPU-sh", ReadOnly: true},
			},
		},
		{
			name: "a shim share of a GPU with a memory budget turns the shim's swapping on", resource: resShared, ids: []string{"GPU-ov::1"},
			wantEnvs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES": "GPU-ov",
				"CUDA_VISIBLE_DEVICES":   "GPU-ov",
				"LD_PRELOAD":             "/usr/lib/gpusharing/libgpushare.so",
				"GPUSHARE_SOCKET":        "/var/run/gpusharing/scheduler/gpushare.sock",
				"GPUSHARE_GPU_UUID":      "GPU-ov",
				"GPUSHARE_OVERSUB":       "1",
			},
			wantMounts: []*pluginapi.Mount{
				{ContainerPath: "/usr/lib/gpusharing/libgpushare.so", HostPath: "/host/lib/libgpushare.so", ReadOnly: true},
				{ContainerPath: "/var/run/gpusharing/scheduler", HostPath: "/host/run/sched/GPU-ov", ReadOnly: true},
			},
		},
		{
			name: "shim shares of two GPUs mount each GPU's socket directory under its uuid and list each GPU's settings", resource: resShared, ids: []string{"GPU-ov::0", "GPU-sh::1"},
			wantEnvs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES": "GPU-ov,GPU-sh",
				"CUDA_VISIBLE_DEVICES":   "GPU-ov,GPU-sh",
				"LD_PRELOAD":             "/usr/lib/gpusharing/libgpushare.so",
				"GPUSHARE_GPU_UUID":      "GPU-ov,GPU-sh",
				"GPUSHARE_SOCKET":        "GPU-ov=/var/run/gpusharing/scheduler/GPU-ov/gpushare.sock,GPU-sh=/var/run/gpusharing/scheduler/GPU-sh/gpushare.sock",
				"GPUSHARE_OVERSUB":       "GPU-ov=1,GPU-sh=0",
			},
			wantMounts: []*pluginapi.Mount{
				{ContainerPath: "/usr/lib/gpusharing/libgpushare.so", HostPath: "/host/lib/libgpushare.so", ReadOnly: true},
				{ContainerPath: "/var/run/gpusharing/scheduler/GPU-ov", HostPath: "/host/run/sched/GPU-ov", ReadOnly: true},
				{ContainerPath: "/var/run/gpusharing/scheduler/GPU-sh", HostPath: "/host/run/sched/GPU-sh", ReadOnly: true},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := dialPlugin(t, k, tc.resource).AllocateOne(ctx, tc.ids...)
			if err != nil {
				t.Fatalf("Allocate %v: %v", tc.ids, err)
			}
			for name, want := range tc.wantEnvs {
				if got, ok := resp.Envs[name]; !ok || got != want {
					t.Errorf("env %s = %q (set: %v), want %q", name, got, ok, want)
				}
			}
			for name := range resp.Envs {
				if _, ok := tc.wantEnvs[name]; !ok {
					t.Errorf("unexpected env %s=%q", name, resp.Envs[name])
				}
			}
			if len(resp.Mounts) != len(tc.wantMounts) {
				t.Fatalf("got %d mounts %v, want %d", len(resp.Mounts), resp.Mounts, len(tc.wantMounts))
			}
			for i, want := range tc.wantMounts {
				got := resp.Mounts[i]
				if got.ContainerPath != want.ContainerPath || got.HostPath != want.HostPath || got.ReadOnly != want.ReadOnly {
					t.Errorf("mount %d: got %s <- %s ro=%v, want %s <- %s ro=%v", i, got.ContainerPath, got.HostPath, got.ReadOnly, want.ContainerPath, want.HostPath, want.ReadOnly)
				}
			}
			if len(resp.Devices) != 0 || len(resp.CdiDevices) != 0 {
				t.Errorf("unexpected device specs %v or CDI devices %v: the NVIDIA runtime injects the GPUs", resp.Devices, resp.CdiDevices)
			}
		})
	}
}

func TestAllocateRefusesWhatItCannotServe(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	st := sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(2, 0, "", "Running")), sharetest.GPU(1, "GPU-b", sharetest.MPS(2, 0, "", "Running")), sharetest.GPU(2, "GPU-c", sharetest.Shim(time.Second)),
		sharetest.GPU(3, "GPU-e", sharetest.TimeSliced(2)), sharetest.GPU(4, "GPU-f", sharetest.TimeSliced(2)))
	if err := m.UpdateFromStatus(ctx, st); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		resource string
		ids      []string
		want     string
	}{
		{"a device the resource does not advertise", resMPS, []string{"GPU-z::0"}, ErrUnknownDevice.Error()},
		{"MPS shares of two GPUs in one container", resMPS, []string{"GPU-a::0", "GPU-b::0"}, share.ErrDevicesSpanGPUs.Error()},
		{"two shim shares of one GPU in one container", resShared, []string{"GPU-c::0", "GPU-c::1"}, share.ErrSharesOnOneGPU.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := k.WaitForRegistrations(ctx, tc.resource, 1); err != nil {
				t.Fatal(err)
			}
			_, err := dialPlugin(t, k, tc.resource).AllocateOne(ctx, tc.ids...)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want InvalidArgument naming %q", err, tc.want)
			}
		})
	}
	// Time-sliced replicas need no shim: a container gets them on several GPUs.
	if _, err := k.WaitForRegistrations(ctx, resTimeSlice, 1); err != nil {
		t.Fatal(err)
	}
	resp, err := dialPlugin(t, k, resTimeSlice).AllocateOne(ctx, "GPU-e::0", "GPU-f::0")
	if err != nil || resp.Envs["CUDA_VISIBLE_DEVICES"] != "GPU-e,GPU-f" {
		t.Errorf("time-sliced replicas of two GPUs: %v, %v; want CUDA_VISIBLE_DEVICES=GPU-e,GPU-f", resp, err)
	}
}

func TestPreferredAllocationSpreadsTimeSliceReplicasOverGRPC(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(4)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(4)))); err != nil {
		t.Fatal(err)
	}
	p := dialPlugin(t, k, resTimeSlice)
	opts, err := p.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions = %v, %v; want preferred allocation available", opts, err)
	}
	got, err := p.Preferred(ctx, []string{"GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::0", "GPU-b::1", "GPU-b::2", "GPU-b::3"}, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"GPU-a::0", "GPU-b::0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("two replicas: got %v, want one on each GPU %v", got, want)
	}
	if _, err := p.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-a::0"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
}

func TestUnhealthyGPUIsPushedThroughListAndWatchWithoutReRegistering(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)))); err != nil {
		t.Fatal(err)
	}
	w := watch(t, ctx, dialPlugin(t, k, resTimeSlice))
	if _, err := w.WaitFor(ctx, func(h map[string]string) bool { return len(h) == 4 }); err != nil {
		t.Fatal(err)
	}
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2), sharetest.Health(metav1.ConditionFalse)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)))); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"GPU-a::0": pluginapi.Unhealthy, "GPU-a::1": pluginapi.Unhealthy, "GPU-b::0": pluginapi.Healthy, "GPU-b::1": pluginapi.Healthy}
	got, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h := fakekubelet.Health(got); !reflect.DeepEqual(h, want) {
		t.Errorf("after Healthy=False: got %v, want %v", h, want)
	}
	if n := len(k.Registrations(resTimeSlice)); n != 1 {
		t.Errorf("a health change re-registered: %d registrations, want 1", n)
	}
	// Healthy again.
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2), sharetest.Health(metav1.ConditionTrue)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)))); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WaitFor(ctx, func(h map[string]string) bool {
		return reflect.DeepEqual(h, allHealthy("GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1"))
	}); err != nil {
		t.Errorf("after Healthy=True: %v", err)
	}
}

func TestKubeletRestartReRegistersEveryResource(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)), sharetest.GPU(2, "GPU-c", sharetest.MPS(2, 0, "", "Running")))); err != nil {
		t.Fatal(err)
	}
	resources := map[string]map[string]string{
		resGPU:       allHealthy("GPU-a"),
		resTimeSlice: allHealthy("GPU-b::0", "GPU-b::1"),
		resMPS:       allHealthy("GPU-c::0", "GPU-c::1"),
	}
	for res, want := range resources {
		if err := k.WaitForDevices(ctx, res, want); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	for res, want := range resources {
		if _, err := k.WaitForRegistrations(ctx, res, 2); err != nil {
			t.Fatalf("after the kubelet restarted: %v", err)
		}
		if err := k.WaitForDevices(ctx, res, want); err != nil {
			t.Errorf("kubelet's view after its restart: %v", err)
		}
		// The re-created socket serves.
		got, err := watch(t, ctx, dialPlugin(t, k, res)).Next(ctx)
		if err != nil || len(got) == 0 {
			t.Errorf("%s after restart: ListAndWatch %v, %v", res, got, err)
		}
	}
}

func TestRegistrationIsRetriedUntilTheKubeletComes(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"))); err == nil {
		t.Fatal("Update with no kubelet: got nil error, want the registration failure")
	}
	k := startKubelet(t, dir)
	if _, err := k.WaitForRegistrations(ctx, resGPU, 1); err != nil {
		t.Fatal(err)
	}
}

// A resource registers once: later changes of its devices (a GPU gone to another strategy, MPS limits)
// go through its open ListAndWatch stream and Allocate, never a new registration, whose old stream's end
// a real kubelet can handle after the new client connected and leave the resource's devices unhealthy.
func TestDeviceChangesGoThroughTheOpenStreamWithoutRegisteringAgain(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	before := sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2)), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)), sharetest.GPU(2, "GPU-c"))
	if err := m.UpdateFromStatus(ctx, before); err != nil {
		t.Fatal(err)
	}
	ts := watch(t, ctx, dialPlugin(t, k, resTimeSlice))
	if _, err := ts.Next(ctx); err != nil {
		t.Fatal(err)
	}

	// GPU-a moves from time-slicing to MPS: the time-slice stream now lists GPU-b's replicas only.
	after := sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(2, 0, "", "Running")), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)), sharetest.GPU(2, "GPU-c"))
	if err := m.UpdateFromStatus(ctx, after); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.WaitFor(ctx, func(h map[string]string) bool { return reflect.DeepEqual(h, allHealthy("GPU-b::0", "GPU-b::1")) }); err != nil {
		t.Fatalf("the open time-slice stream did not send GPU-b's replicas only: %v", err)
	}
	if _, err := k.WaitForRegistrations(ctx, resMPS, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resTimeSlice, allHealthy("GPU-b::0", "GPU-b::1")); err != nil {
		t.Error(err)
	}
	if err := k.WaitForDevices(ctx, resMPS, allHealthy("GPU-a::0", "GPU-a::1")); err != nil {
		t.Error(err)
	}

	// An MPS setting in force changes (thread percentage): Allocate gives the new one at once.
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(2, 30, "", "Running")), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)), sharetest.GPU(2, "GPU-c"))); err != nil {
		t.Fatal(err)
	}
	resp, err := dialPlugin(t, k, resMPS).AllocateOne(ctx, "GPU-a::0")
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; got != "30" {
		t.Errorf("Allocate after the limit changed: thread percentage %q, want 30", got)
	}
	for res, want := range map[string]int{resTimeSlice: 1, resMPS: 1, resGPU: 1} {
		if n := len(k.Registrations(res)); n != want {
			t.Errorf("%s registered %d times, want %d", res, n, want)
		}
	}
}

func TestResourceLeftWithoutDevicesIsAdvertisedEmptyThenStopped(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2)))); err != nil {
		t.Fatal(err)
	}
	w := watch(t, ctx, dialPlugin(t, k, resTimeSlice))
	if _, err := w.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.Exclusive()))); err != nil {
		t.Fatal(err)
	}
	got, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("want an empty list before the stream ends: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("last list: got %v, want empty", fakekubelet.Health(got))
	}
	if _, err := w.Next(ctx); !errors.Is(err, fakekubelet.ErrStreamEnded) {
		t.Errorf("after the empty list: %v, want the stream ended", err)
	}
	if _, ok := m.Advertised()[resTimeSlice]; ok {
		t.Errorf("time-slice resource still served: %v", m.Advertised())
	}
	if _, err := os.Stat(dir + "/" + socketName(resTimeSlice)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stopped plugin's socket: %v, want it removed", err)
	}
}

func TestCordonHidesAGPUsDevicesAndUncordonRestoresThem(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	st := sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"), sharetest.GPU(1, "GPU-b"), sharetest.GPU(2, "GPU-m", sharetest.MIGInstance("1g.10gb", "MIG-a")))
	if err := m.UpdateFromStatus(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := m.Cordon(ctx, "GPU-a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Cordon(ctx, "GPU-m"); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-b")); err != nil {
		t.Fatal(err)
	}
	p := dialPlugin(t, k, resGPU)
	got, err := watch(t, ctx, p).Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h := fakekubelet.Health(got); !reflect.DeepEqual(h, allHealthy("GPU-b")) {
		t.Errorf("with GPU-a cordoned: got %v, want GPU-b only", h)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-b")); err != nil {
		t.Errorf("kubelet's view with GPU-a cordoned: %v", err)
	}
	if _, err := p.AllocateOne(ctx, "GPU-a"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate of a cordoned GPU: got %v, want InvalidArgument", err)
	}
	if _, ok := m.Advertised()[resMIG1g]; ok {
		t.Error("cordoning a MIG GPU left its instances advertised")
	}
	// A status update while cordoned does not bring the GPU back.
	if err := m.UpdateFromStatus(ctx, st); err != nil {
		t.Fatal(err)
	}
	if got := m.Cordoned(); !reflect.DeepEqual(got, []string{"GPU-a", "GPU-m"}) {
		t.Errorf("Cordoned = %v", got)
	}
	if n := len(m.Advertised()[resGPU]); n != 1 {
		t.Errorf("after an update while cordoned: %d exclusive GPUs advertised, want 1", n)
	}

	if err := m.Uncordon(ctx, "GPU-a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Uncordon(ctx, "GPU-m"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range m.Advertised()[resGPU] {
		ids = append(ids, d.ID)
	}
	sort.Strings(ids)
	if !reflect.DeepEqual(ids, []string{"GPU-a", "GPU-b"}) {
		t.Errorf("after Uncordon: %v, want GPU-a and GPU-b", ids)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-a", "GPU-b")); err != nil {
		t.Errorf("kubelet's view after Uncordon: %v", err)
	}
	if err := k.WaitForDevices(ctx, resMIG1g, allHealthy("MIG-a")); err != nil {
		t.Errorf("MIG instances not re-advertised after Uncordon: %v", err)
	}
	// The exclusive resource kept its devices' list current on its one registration.
	if n := len(k.Registrations(resGPU)); n != 1 {
		t.Errorf("nvidia.com/gpu registered %d times, want 1", n)
	}
}

func TestAPluginTheKubeletDropsRegistersAgain(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"))); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-a")); err != nil {
		t.Fatal(err)
	}
	k.Disconnect(resGPU)
	if _, err := k.WaitForRegistrations(ctx, resGPU, 2); err != nil {
		t.Fatalf("after the kubelet dropped the plugin: %v", err)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-a")); err != nil {
		t.Errorf("kubelet's view after registering again: %v", err)
	}
}

// A registration the kubelet accepts but whose stream never opens (a re-registration racing the old
// stream's end on a real kubelet) leaves no stream to end: the plugin registers again after streamGrace.
func TestARegistrationWhoseStreamNeverOpensRegistersAgain(t *testing.T) {
	ctx := testCtx(t)
	dir := socketDir(t)
	k := startKubelet(t, dir)
	k.DropNextRegistration(resGPU)
	m := runManager(t, testConfig(dir))
	if err := m.UpdateFromStatus(ctx, sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"))); err != nil {
		t.Fatal(err)
	}
	if _, err := k.WaitForRegistrations(ctx, resGPU, 2); err != nil {
		t.Fatalf("after a registration the kubelet dropped before its stream: %v", err)
	}
	if err := k.WaitForDevices(ctx, resGPU, allHealthy("GPU-a")); err != nil {
		t.Errorf("kubelet's view after registering again: %v", err)
	}
}
