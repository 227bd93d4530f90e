package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/podpid"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

var errAPIAway = errors.New("the API server does not answer")

// awayReader is an API server that answers nothing: every pod lookup fails.
type awayReader struct{}

func (awayReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errAPIAway
}

func (awayReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errAPIAway
}

// sizedShimNode is a node with one 40 GiB GPU sized per claim over the shim.
func sizedShimNode(gpu string) v1alpha1.GPUNodeStatus {
	step := resource.MustParse("1Gi")
	return v1alpha1.GPUNodeStatus{GPUs: []v1alpha1.GPUStatus{{
		Index: 0, UUID: gpu, Product: "NVIDIA A100-SXM4-40GB", Memory: resource.NewQuantity(40<<30, resource.BinarySI),
		Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4},
			Shim: &v1alpha1.ShimStatus{}, Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &step}},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}},
	}}}
}

// A claim shared by two pods is one ledger for the processes of both while no pod can be looked up: the
// kubelet plugin recorded the pods' UIDs when it prepared the claim, and each process's cgroup names its
// pod's UID, so the API server is not asked.
func TestASharedClaimIsOneLedgerWhilePodLookupsFail(t *testing.T) {
	ctx := context.Background()
	node, gpu := "ledger-uid", "GPU-0000000a-0000-0000-0000-00000000a100"
	root, err := os.MkdirTemp("", "led")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	cfg := dra.PluginConfig{PluginDir: filepath.Join(root, "p"), RegistryDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi")}
	plugin, err := dra.NewKubeletPlugin(node, cfg, share.Config{SchedulerRoot: "/run/gpusharing/scheduler",
		ShimLibrary: "/var/lib/gpusharing/lib/libgpushare.so"}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	plugin.Update(sizedShimNode(gpu))
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	h, err := plugin.Start(runCtx, kube)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(); cancel() })

	first, second, solo := uuid.NewUUID(), uuid.NewUUID(), uuid.NewUUID()
	shared := sizedClaimFor(t, ctx, node, "shared-"+node, "8Gi", map[string]types.UID{"first": first, "second": second})
	alone := sizedClaimFor(t, ctx, node, "solo-"+node, "2Gi", map[string]types.UID{"solo": solo})
	res, err := plugin.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{shared, alone})
	if err != nil {
		t.Fatal(err)
	}
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("preparing claim %s: %v", uid, r.Err)
		}
	}

	procRoot := t.TempDir()
	pids := map[types.UID]int32{first: 101, second: 102, solo: 103}
	for uid, pid := range pids {
		dir := filepath.Join(procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cg := fmt.Sprintf("0::/kubepods/burstable/pod%s/%064x\n", uid, pid)
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pods := &podpid.Resolver{Reader: awayReader{}, NodeName: node, ProcRoot: procRoot}
	if refs := pods.Refs(ctx, []int32{101, 102, 103}); len(refs) != 0 {
		t.Fatalf("pod lookups with the API server away = %v, want none", refs)
	}
	claimOf := claimLedgers(plugin, procRoot, pods)
	sharedLedger := scheduler.Claim{Key: "default/" + shared.Name, Memory: 8 << 30}
	for _, c := range []struct {
		pid  int32
		want scheduler.Claim
	}{
		{101, sharedLedger},
		{102, sharedLedger},
		{103, scheduler.Claim{Key: "default/" + alone.Name, Memory: 2 << 30}},
	} {
		if got, ok := claimOf(gpu, c.pid); !ok || got != c.want {
			t.Errorf("ledger of pid %d = %+v, %v; want %+v", c.pid, got, ok, c.want)
		}
	}
	if got, ok := claimOf(gpu, 104); ok {
		t.Errorf("ledger of a process that is gone = %+v, want none", got)
	}
}

// sizedClaimFor is a claim the scheduler allocated a share of the node's sized GPU 0 with memory,
// reserved for pods (name: UID, in "default").
func sizedClaimFor(t *testing.T, ctx context.Context, node, name, memory string, pods map[string]types.UID) *resourcev1.ResourceClaim {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized"}}}}}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), claim) })
	share := uuid.NewUUID()
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: node, Device: "gpu-0-sized", ShareID: &share,
			ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}}}}}
	for pod, uid := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: pod, UID: uid})
	}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	return claim
}
