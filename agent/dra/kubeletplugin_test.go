package dra_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// The host paths the kubelet plugin hands out, as the agent configures them.
var dpConfig = share.Config{MPSRoot: "/run/gpusharing/mps", SchedulerRoot: "/run/gpusharing/scheduler",
	ShimLibrary: "/var/lib/gpusharing/lib/libgpushare.so"}

// pluginDirs are one node's kubelet plugin directories, short enough for Unix socket paths.
// reserve is the plugin's context reserve (PluginConfig.ContextReserve).
type pluginDirs struct {
	plugin, registry, cdi string
	reserve               int64
}

func newPluginDirs(t *testing.T) pluginDirs {
	t.Helper()
	root, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	return pluginDirs{plugin: filepath.Join(root, "p"), registry: filepath.Join(root, "r"), cdi: filepath.Join(root, "cdi")}
}

func (d pluginDirs) config() dra.PluginConfig {
	return dra.PluginConfig{PluginDir: d.plugin, RegistryDir: d.registry, CDIDir: d.cdi, ContextReserve: d.reserve}
}

// startPlugin runs the kubelet plugin as the agent does and returns a DRA v1 client on its socket, as the
// kubelet dials it, and a stop func (an agent exit).
func startPlugin(t *testing.T, env *testenv.Env, dirs pluginDirs, known bool) (drapb.DRAPluginClient, func()) {
	t.Helper()
	var status *v1alpha1.GPUNodeStatus
	if known {
		st := mixedNode()
		status = &st
	}
	return startPluginWith(t, env, dirs, status)
}

// startPluginWith is startPlugin told status first, when not nil.
func startPluginWith(t *testing.T, env *testenv.Env, dirs pluginDirs, status *v1alpha1.GPUNodeStatus) (drapb.DRAPluginClient, func()) {
	t.Helper()
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if status != nil {
		p.Update(*status)
	}
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h, err := p.Start(ctx, kube)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dirs.plugin, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = conn.Close()
			h.Stop()
			cancel()
		}
	}
	t.Cleanup(stop)
	return drapb.NewDRAPluginClient(conn), stop
}

func claimRef(t *testing.T, ctx context.Context, c client.Client, name string) *drapb.Claim {
	t.Helper()
	var claim resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &claim); err != nil {
		t.Fatal(err)
	}
	return &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
}

// readCDI reads the claim's spec file as container runtimes do (the CDI package, which validates it)
// and checks it defines one device of the plugin's kind, at the lowest CDI version that has what it uses.
func readCDI(t *testing.T, dir, uid string) *cdiapi.Spec {
	t.Helper()
	f, err := cdiapi.ReadSpec(filepath.Join(dir, "gpusharing.io-claim_"+uid+".json"), 0)
	if err != nil {
		t.Fatal(err)
	}
	minimum, err := cdispec.MinimumRequiredVersion(f.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != minimum || f.Kind != "gpusharing.io/claim" || len(f.Devices) != 1 {
		t.Fatalf("CDI spec %s: version %s (the spec needs %s), kind %s, %d devices", uid, f.Version, minimum, f.Kind, len(f.Devices))
	}
	return f
}

func mountsOf(f *cdiapi.Spec) []string {
	var out []string
	for _, m := range f.Devices[0].ContainerEdits.Mounts {
		out = append(out, m.HostPath+":"+m.ContainerPath+":"+m.Options[0])
	}
	return out
}

// container is what a runtime makes of an empty container given the CDI device id: the CDI package's
// own injection (containerd's and CRI-O's), from the specs in dir. Mounts are sorted: the injection
// orders them by depth.
func container(t *testing.T, dir, id string) (env, mounts []string) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	oci := &ocispec.Spec{Process: &ocispec.Process{}, Linux: &ocispec.Linux{}}
	if unresolved, err := cache.InjectDevices(oci, id); err != nil {
		t.Fatalf("injecting %s: %v (unresolved %v; the directory's errors %v)", id, err, unresolved, cache.GetErrors())
	}
	for _, m := range oci.Mounts {
		mounts = append(mounts, m.Source+":"+m.Destination+":"+m.Options[0])
	}
	slices.Sort(mounts)
	return oci.Process.Env, mounts
}

// multiClaim creates a claim for count MPS shares below 50% of the threads (GPU 2's, 25% each) and a pod.
func multiClaim(t *testing.T, ctx context.Context, c client.Client, name string, count int64) {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mps", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.gpusharing.io"].mpsActiveThreadPercentage < 50`}}}}}}}}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	podFor(t, ctx, c, name)
}

// schedulingCluster is draCluster with the mixed node's devices published and the real kube-scheduler
// allocating claims from them.
func schedulingCluster(t *testing.T) (context.Context, *testenv.Env) {
	t.Helper()
	ctx, env := draCluster(t)
	publish(t, ctx, env, startPublisher(t, env, dra.PublisherOptions{}), dra.Devices(mixedNode(), dpConfig))
	startScheduler(t, env)
	return ctx, env
}

func TestKubeletPluginPreparesSchedulerAllocatedClaimsWithWhatAllocateGives(t *testing.T) {
	ctx, env := schedulingCluster(t)
	c := env.Client
	attr := `device.attributes["gpu.gpusharing.io"]`
	claimPod(t, ctx, c, "whole", "gpusharing-exclusive", "")
	claimPod(t, ctx, c, "mig", "gpusharing-mig", attr+`.migProfile == "3g.40gb"`)
	claimPod(t, ctx, c, "mps", "gpusharing-mps", attr+`.mpsActiveThreadPercentage >= 50`)
	claimPod(t, ctx, c, "shared", "gpusharing-shared", "")
	multiClaim(t, ctx, c, "mps-two", 2)
	for _, name := range []string{"whole", "mig", "mps", "shared"} {
		allocated(t, ctx, c, name)
	}
	waitAllocated(t, ctx, c, "mps-two")

	dirs := newPluginDirs(t)
	kubelet, stop := startPlugin(t, env, dirs, true)

	// The kubelet finds the plugin through its registration socket: the DRA services on dra.sock.
	regConn, err := grpc.NewClient("unix://"+filepath.Join(dirs.registry, dra.DriverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = regConn.Close() }()
	info, err := registerapi.NewRegistrationClient(regConn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != dra.DriverName || info.Endpoint != filepath.Join(dirs.plugin, "dra.sock") || !strings.Contains(strings.Join(info.SupportedVersions, " "), "v1.DRAPlugin") {
		t.Errorf("registration info = %+v", info)
	}

	const gpu1, gpu2, gpu4, gpu5 = "GPU-00000001-0000-0000-0000-000000000000", "GPU-00000002-0000-0000-0000-000000000000",
		"GPU-00000004-0000-0000-0000-000000000000", "GPU-00000005-0000-0000-0000-000000000000"
	want := map[string]struct{ env, mounts []string }{
		"whole": {env: []string{"CUDA_VISIBLE_DEVICES=" + gpu5, "NVIDIA_VISIBLE_DEVICES=" + gpu5}},
		"mig":   {env: []string{"CUDA_VISIBLE_DEVICES=MIG-0000-3g", "NVIDIA_VISIBLE_DEVICES=MIG-0000-3g"}},
		"mps": {
			env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "CUDA_MPS_PIPE_DIRECTORY=/var/run/gpusharing/mps",
				"CUDA_VISIBLE_DEVICES=" + gpu1, "NVIDIA_VISIBLE_DEVICES=" + gpu1},
			mounts: []string{"/run/gpusharing/mps/" + gpu1 + "/pipe:/var/run/gpusharing/mps:rw", "/run/gpusharing/mps/" + gpu1 + "/shm:/dev/shm:rw"},
		},
		// Two MPS shares in one request are one client with their threads added up.
		"mps-two": {
			env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PIPE_DIRECTORY=/var/run/gpusharing/mps",
				"CUDA_VISIBLE_DEVICES=" + gpu2, "NVIDIA_VISIBLE_DEVICES=" + gpu2},
			mounts: []string{"/run/gpusharing/mps/" + gpu2 + "/pipe:/var/run/gpusharing/mps:rw", "/run/gpusharing/mps/" + gpu2 + "/shm:/dev/shm:rw"},
		},
		"shared": {
			env: []string{"CUDA_VISIBLE_DEVICES=" + gpu4, "GPUSHARE_GPU_UUID=" + gpu4, "GPUSHARE_OVERSUB=1", "GPUSHARE_SOCKET=/var/run/gpusharing/scheduler/gpushare.sock",
				"LD_PRELOAD=/usr/lib/gpusharing/libgpushare.so", "NVIDIA_VISIBLE_DEVICES=" + gpu4},
			mounts: []string{"/var/lib/gpusharing/lib/libgpushare.so:/usr/lib/gpusharing/libgpushare.so:ro", "/run/gpusharing/scheduler/" + gpu4 + ":/var/run/gpusharing/scheduler:ro"},
		},
	}
	var claims []*drapb.Claim
	for _, name := range []string{"whole", "mig", "mps", "mps-two", "shared"} {
		claims = append(claims, claimRef(t, ctx, c, name))
	}
	resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims {
		got := resp.Claims[cl.Uid]
		if got == nil || got.Error != "" {
			t.Fatalf("claim %s: %+v", cl.Name, got)
		}
		wantDevs := 1
		if cl.Name == "mps-two" {
			wantDevs = 2
		}
		if len(got.Devices) != wantDevs || got.Devices[0].PoolName != nodeName || !reflect.DeepEqual(got.Devices[0].RequestNames, []string{"gpu"}) {
			t.Fatalf("claim %s devices %+v", cl.Name, got.Devices)
		}
		cdiID := "gpusharing.io/claim=" + cl.Uid + "-gpu"
		if !reflect.DeepEqual(got.Devices[0].CdiDeviceIds, []string{cdiID}) {
			t.Errorf("claim %s CDI ids %v, want [%s]", cl.Name, got.Devices[0].CdiDeviceIds, cdiID)
		}
		for _, d := range got.Devices[1:] {
			if len(d.CdiDeviceIds) != 0 {
				t.Errorf("claim %s: the request's edits named twice: %+v", cl.Name, got.Devices)
			}
		}
		f := readCDI(t, dirs.cdi, cl.Uid)
		if f.Devices[0].Name != cl.Uid+"-gpu" {
			t.Errorf("claim %s CDI device %q", cl.Name, f.Devices[0].Name)
		}
		if env := f.Devices[0].ContainerEdits.Env; !reflect.DeepEqual(env, want[cl.Name].env) {
			t.Errorf("claim %s CDI env\n got %v\nwant %v", cl.Name, env, want[cl.Name].env)
		}
		if m := mountsOf(f); !reflect.DeepEqual(m, want[cl.Name].mounts) {
			t.Errorf("claim %s CDI mounts\n got %v\nwant %v", cl.Name, m, want[cl.Name].mounts)
		}
		// The container the runtime makes from the returned id has exactly these.
		env, mounts := container(t, dirs.cdi, cdiID)
		wantMounts := slices.Sorted(slices.Values(want[cl.Name].mounts))
		if !reflect.DeepEqual(env, want[cl.Name].env) || !reflect.DeepEqual(mounts, wantMounts) {
			t.Errorf("claim %s: the container of %s has env %v mounts %v; want %v and %v", cl.Name, cdiID, env, mounts, want[cl.Name].env, wantMounts)
		}
	}

	// The agent restarts. The new plugin has not seen a status yet, so only its checkpoint can answer: a
	// repeated prepare gets the same devices and writes again a spec that no longer reads as one (cut
	// short), an unprepare removes the spec of a claim the previous process prepared.
	stop()
	whole := filepath.Join(dirs.cdi, "gpusharing.io-claim_"+claims[0].Uid+".json")
	if err := os.WriteFile(whole, []byte(`{"cdiVersion":"0.3.0","kind":"gpusharing.io/cl`), 0o600); err != nil {
		t.Fatal(err)
	}
	kubelet, _ = startPlugin(t, env, dirs, false)
	again, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims[:1]})
	if err != nil {
		t.Fatal(err)
	}
	if g := again.Claims[claims[0].Uid]; g == nil || g.Error != "" || !reflect.DeepEqual(g.Devices[0].CdiDeviceIds, resp.Claims[claims[0].Uid].Devices[0].CdiDeviceIds) {
		t.Errorf("prepare after a restart = %+v, want %+v", g, resp.Claims[claims[0].Uid])
	}
	if env, _ := container(t, dirs.cdi, "gpusharing.io/claim="+claims[0].Uid+"-gpu"); !reflect.DeepEqual(env, want["whole"].env) {
		t.Errorf("the spec cut short was not written again: the container has env %v", env)
	}
	un, err := kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims[2:3]})
	if err != nil {
		t.Fatal(err)
	}
	if g := un.Claims[claims[2].Uid]; g == nil || g.Error != "" {
		t.Fatalf("unprepare after a restart = %+v", g)
	}
	if _, err := os.Stat(filepath.Join(dirs.cdi, "gpusharing.io-claim_"+claims[2].Uid+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the CDI spec of the unprepared claim is still there: %v", err)
	}
	// Unpreparing again is no error, and the other claims' specs stay.
	if un, err = kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims[2:3]}); err != nil || un.Claims[claims[2].Uid].GetError() != "" {
		t.Errorf("second unprepare = %+v, %v", un, err)
	}
	readCDI(t, dirs.cdi, claims[3].Uid)
	data, err := os.ReadFile(filepath.Join(dirs.plugin, dra.CheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), claims[2].Uid) || !strings.Contains(string(data), claims[3].Uid) {
		t.Errorf("checkpoint after unprepare:\n%s", data)
	}
}

// A device the node stopped publishing since the allocation (its GPU turned unhealthy) is not prepared:
// the claim gets an error the kubelet retries, and no spec is written.
func TestKubeletPluginRefusesADeviceTheNodeNoLongerPublishes(t *testing.T) {
	ctx, env := schedulingCluster(t)
	c := env.Client
	claimPod(t, ctx, c, "whole", "gpusharing-exclusive", "")
	allocated(t, ctx, c, "whole")

	dirs := newPluginDirs(t)
	p, err := dra.NewKubeletPlugin(nodeName, dirs.config(), dpConfig, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	st := mixedNode()
	st.GPUs[5].Conditions[0].Status = metav1.ConditionFalse
	p.Update(st)
	var claim resourcev1.ResourceClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "whole"}, &claim); err != nil {
		t.Fatal(err)
	}
	res, err := p.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{&claim})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[claim.UID].Err, dra.ErrDeviceNotPublished) {
		t.Errorf("prepare of a device no longer published = %v, want ErrDeviceNotPublished", res[claim.UID].Err)
	}
	if entries, _ := os.ReadDir(dirs.cdi); len(entries) != 0 {
		t.Errorf("CDI specs written for a refused claim: %v", entries)
	}
	// A second claim for the same device (something went wrong upstream) is refused once the first holds it.
	p.Update(mixedNode())
	if res, _ := p.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{&claim}); res[claim.UID].Err != nil {
		t.Fatal(res[claim.UID].Err)
	}
	other := claim.DeepCopy()
	other.UID, other.Name = "00000000-0000-0000-0000-00000000beef", "impostor"
	if res, _ := p.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{other}); !errors.Is(res[other.UID].Err, dra.ErrDeviceInUse) {
		t.Errorf("second claim on a prepared device = %v, want ErrDeviceInUse", res[other.UID].Err)
	}
}

func waitAllocated(t *testing.T, ctx context.Context, c client.Client, name string) {
	t.Helper()
	wait.Until(t, 60*time.Second, func() bool {
		var claim resourcev1.ResourceClaim
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &claim)
		return err == nil && claim.Status.Allocation != nil
	}, "claim %s allocated", name)
}

// sizedMPSAndShimNode is sizedNode with a second 40 GiB GPU sized per claim over the shim (time-sliced x4).
func sizedMPSAndShimNode() v1alpha1.GPUNodeStatus {
	st := sizedNode()
	step := resource.MustParse("1Gi")
	st.GPUs = append(st.GPUs, v1alpha1.GPUStatus{
		Index: 1, UUID: "GPU-00000001-0000-0000-0000-00000000a100", Product: "NVIDIA A100-SXM4-40GB",
		Memory: resource.NewQuantity(40<<30, resource.BinarySI),
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4},
			Shim: &v1alpha1.ShimStatus{}, Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &step}},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}},
	})
	return st
}

// Claims the real scheduler allocated on sized GPUs get their sizes as limits: on MPS the client's pinned
// memory (the claim less the context reserve, which NVML counts and the limit does not) and thread
// percentage, on the shim its memory limit beside the shim's LD_PRELOAD. Two claims share one sized
// device, which is no ErrDeviceInUse.
func TestKubeletPluginPreparesSizedClaimsWithTheirSizesAsLimits(t *testing.T) {
	ctx, env := draCluster(t)
	c := env.Client
	st := sizedMPSAndShimNode()
	publish(t, ctx, env, startPublisher(t, env, dra.PublisherOptions{}), dra.Devices(st, dpConfig))
	startScheduler(t, env)
	onMPS := `device.attributes["gpu.gpusharing.io"].sizeEnforcement == "MPS"`
	onShim := `device.attributes["gpu.gpusharing.io"].sizeEnforcement == "ShimMemory"`
	sizedClaimPod(t, ctx, c, "mps-10g", "10Gi", "30", onMPS)
	sizedClaimPod(t, ctx, c, "mps-default", "", "", onMPS)
	sizedClaimPod(t, ctx, c, "shim-6g", "5500Mi", "20", onShim)
	for _, name := range []string{"mps-10g", "mps-default", "shim-6g"} {
		allocated(t, ctx, c, name)
	}

	dirs := newPluginDirs(t)
	dirs.reserve = dra.DefaultContextReserve
	kubelet, _ := startPluginWith(t, env, dirs, &st)
	const mpsGPU, shimGPU = "GPU-00000000-0000-0000-0000-00000000a100", "GPU-00000001-0000-0000-0000-00000000a100"
	mpsMounts := []string{"/run/gpusharing/mps/" + mpsGPU + "/pipe:/var/run/gpusharing/mps:rw", "/run/gpusharing/mps/" + mpsGPU + "/shm:/dev/shm:rw",
		"/var/lib/gpusharing/lib/libgpushare.so:/usr/lib/gpusharing/libgpushare.so:ro"}
	want := map[string]struct{ env, mounts []string }{
		// MPS holds the claim less the 768Mi context reserve; the shim, with no scheduler socket, reports
		// that limit as the GPU's memory.
		"mps-10g": {env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=9472M", "CUDA_MPS_PIPE_DIRECTORY=/var/run/gpusharing/mps",
			"CUDA_VISIBLE_DEVICES=" + mpsGPU, "GPUSHARE_MEMORY_LIMIT_BYTES=9932111872", "LD_PRELOAD=/usr/lib/gpusharing/libgpushare.so", "NVIDIA_VISIBLE_DEVICES=" + mpsGPU}, mounts: mpsMounts},
		// A claim that asks nothing: a fixed share of 8 replicas, 40Gi/8 and 100/8 percent.
		"mps-default": {env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4352M", "CUDA_MPS_PIPE_DIRECTORY=/var/run/gpusharing/mps",
			"CUDA_VISIBLE_DEVICES=" + mpsGPU, "GPUSHARE_MEMORY_LIMIT_BYTES=4563402752", "LD_PRELOAD=/usr/lib/gpusharing/libgpushare.so", "NVIDIA_VISIBLE_DEVICES=" + mpsGPU}, mounts: mpsMounts},
		// 5500Mi rounded up to the 1Gi step: 6 GiB. Compute is not limited on a shim GPU.
		"shim-6g": {env: []string{"CUDA_VISIBLE_DEVICES=" + shimGPU, "GPUSHARE_GPU_UUID=" + shimGPU, "GPUSHARE_MEMORY_LIMIT_BYTES=6442450944",
			"GPUSHARE_SOCKET=/var/run/gpusharing/scheduler/gpushare.sock", "LD_PRELOAD=/usr/lib/gpusharing/libgpushare.so", "NVIDIA_VISIBLE_DEVICES=" + shimGPU},
			mounts: []string{"/var/lib/gpusharing/lib/libgpushare.so:/usr/lib/gpusharing/libgpushare.so:ro", "/run/gpusharing/scheduler/" + shimGPU + ":/var/run/gpusharing/scheduler:ro"}},
	}
	var claims []*drapb.Claim
	for _, name := range []string{"mps-10g", "mps-default", "shim-6g"} {
		claims = append(claims, claimRef(t, ctx, c, name))
	}
	// One call for all three, as the kubelet does for a pod's claims: the two MPS claims share a device.
	resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims {
		got := resp.Claims[cl.Uid]
		if got == nil || got.Error != "" {
			t.Fatalf("claim %s: %+v", cl.Name, got)
		}
		if len(got.Devices) != 1 || !strings.HasSuffix(got.Devices[0].DeviceName, "-sized") || got.Devices[0].GetShareId() == "" {
			t.Errorf("claim %s devices %+v: want one share of a sized device", cl.Name, got.Devices)
		}
		f := readCDI(t, dirs.cdi, cl.Uid)
		if env := f.Devices[0].ContainerEdits.Env; !reflect.DeepEqual(env, want[cl.Name].env) {
			t.Errorf("claim %s CDI env\n got %v\nwant %v", cl.Name, env, want[cl.Name].env)
		}
		if m := mountsOf(f); !reflect.DeepEqual(m, want[cl.Name].mounts) {
			t.Errorf("claim %s CDI mounts\n got %v\nwant %v", cl.Name, m, want[cl.Name].mounts)
		}
	}
}
