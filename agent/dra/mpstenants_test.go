package dra_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

// GPU 2 of mixedNode: MPS with 4 replicas at 25% of the threads.
const mpsGPU2 = "GPU-00000002-0000-0000-0000-000000000000"

// tenantNode is a kubelet plugin over mixedNode that runs namespace daemons through a real MPS manager
// with the fake nvidia-cuda-mps-control.
type tenantNode struct {
	dirs pluginDirs
	root string
	fake *fakebin.Fake
	mps  *mps.Manager
	p    *dra.KubeletPlugin
}

func newTenantNode(t *testing.T) *tenantNode {
	t.Helper()
	dirs := newPluginDirs(t)
	bin := t.TempDir()
	n := &tenantNode{dirs: dirs, root: filepath.Join(bin, "mps"), fake: fakebin.MPSControl(t, bin)}
	n.restart(t, mixedNode())
	return n
}

// restart is an agent restart: a new MPS manager and a new plugin over the same directories, told status.
func (n *tenantNode) restart(t *testing.T, status v1alpha1.GPUNodeStatus) {
	t.Helper()
	n.mps = mps.New(mps.Config{Control: n.fake.Path, Root: n.root, Runner: runner.Exec{}, StartTimeout: 5 * time.Second})
	p, err := dra.NewKubeletPlugin(nodeName, n.dirs.config(), share.Config{MPSRoot: n.root}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p.MPS = n.mps
	p.Update(status)
	n.p = p
}

// mpsShareClaim is a claim of namespace ns allocated one MPS share of GPU 2, as the scheduler writes it.
func mpsShareClaim(ns, name, device string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name)},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mps"}}}}},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: nodeName, Device: device}}}}},
	}
}

func (n *tenantNode) prepare(t *testing.T, c *resourcev1.ResourceClaim) {
	t.Helper()
	if err := prepareOne(context.Background(), n.p, c); err != nil {
		t.Fatalf("preparing %s/%s: %v", c.Namespace, c.Name, err)
	}
}

func (n *tenantNode) unprepare(t *testing.T, c *resourcev1.ResourceClaim) {
	t.Helper()
	if err := unprepareOne(context.Background(), n.p, c); err != nil {
		t.Fatalf("unpreparing %s/%s: %v", c.Namespace, c.Name, err)
	}
}

func (n *tenantNode) wantTenants(t *testing.T, when string, want ...string) {
	t.Helper()
	var got []string
	for _, tn := range n.mps.Tenants() {
		if tn.GPU != mpsGPU2 {
			t.Errorf("%s: a daemon of namespace %s on GPU %s, want only GPU 2's", when, tn.Namespace, tn.GPU)
		}
		got = append(got, tn.Namespace)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: namespace daemons running %v, want %v", when, got, want)
	}
}

// Each namespace's MPS claims on a GPU connect to that namespace's daemon: it starts with the
// namespace's first claim, with the GPU daemon's settings, and quits with its last; the CDI spec
// mounts its pipe directory and /dev/shm and nothing of the other namespace's.
func TestEachNamespacesMPSClaimsGetADaemonThatLivesAsLongAsTheirClaims(t *testing.T) {
	n := newTenantNode(t)
	a1, a2 := mpsShareClaim("team-a", "one", "gpu-2-mps-0"), mpsShareClaim("team-a", "two", "gpu-2-mps-1")
	b1 := mpsShareClaim("team-b", "one", "gpu-2-mps-2")
	n.prepare(t, a1)
	calls := n.fake.Calls(t)
	if len(calls) != 2 || !strings.HasPrefix(calls[0], "nvidia-cuda-mps-control -d") || !strings.Contains(calls[0], "/ns/team-a/pipe") ||
		!strings.HasPrefix(calls[1], "nvidia-cuda-mps-control <<< set_default_active_thread_percentage 25") {
		t.Errorf("the first claim of team-a ran %q, want its daemon started with GPU 2's 25%% threads", calls)
	}
	n.prepare(t, a2)
	if calls := n.fake.Calls(t); len(calls) != 0 {
		t.Errorf("team-a's second claim ran %q, want its running daemon used as it is", calls)
	}
	n.prepare(t, b1)
	n.wantTenants(t, "three claims of two namespaces", "team-a", "team-b")

	for _, c := range []*resourcev1.ResourceClaim{a1, b1} {
		dir := filepath.Join(n.root, mpsGPU2, "ns", c.Namespace)
		want := []string{filepath.Join(dir, "pipe") + ":" + share.ContainerMPSPipeDir + ":rw", filepath.Join(dir, "shm") + ":" + share.ContainerShm + ":rw"}
		if got := mountsOf(readCDI(t, n.dirs.cdi, string(c.UID))); !reflect.DeepEqual(got, want) {
			t.Errorf("claim %s/%s mounts %v, want only its namespace's daemon: %v", c.Namespace, c.Name, got, want)
		}
	}

	n.unprepare(t, a1)
	n.wantTenants(t, "team-a's first claim unprepared", "team-a", "team-b")
	n.unprepare(t, a2)
	n.wantTenants(t, "team-a's last claim unprepared", "team-b")
	if _, err := os.Stat(filepath.Join(n.root, mpsGPU2, "ns", "team-a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("team-a's daemon directory outlives its last claim (%v)", err)
	}
	n.unprepare(t, b1)
	n.wantTenants(t, "every claim unprepared")
}

// An agent restart keeps the namespaces' daemons and their clients: the plugin's sync adopts the daemon
// of each namespace the checkpoint's claims use, with no new daemon and no quit, and watches it again.
func TestARestartedAgentAdoptsTheDaemonsOfTheCheckpointsClaims(t *testing.T) {
	n := newTenantNode(t)
	ctx := context.Background()
	n.prepare(t, mpsShareClaim("team-a", "one", "gpu-2-mps-0"))
	n.prepare(t, mpsShareClaim("team-b", "one", "gpu-2-mps-1"))
	pids := map[string]int{"team-a": daemonPID(t, n.root, "team-a"), "team-b": daemonPID(t, n.root, "team-b")}
	n.fake.Calls(t)

	n.restart(t, mixedNode())
	dra.SyncMPSTenants(ctx, n.p)
	for _, c := range n.fake.Calls(t) {
		if strings.Contains(c, " -d") || strings.Contains(c, "quit") {
			t.Errorf("the restarted agent ran %q on a daemon with prepared claims", c)
		}
	}
	for ns, pid := range pids {
		if st, ok := n.mps.TenantStatus(mpsGPU2, ns); !ok || st.PID != pid || st.State != mps.StateRunning {
			t.Errorf("%s's daemon after the restart: %+v (known %v), want the running %d adopted", ns, st, ok, pid)
		}
	}
	n.wantTenants(t, "after the restart", "team-a", "team-b")
}

// A namespace daemon left with no claim (its last claim was forgotten as gone while the agent was down)
// is quit by the next sync.
func TestASyncQuitsTheDaemonOfANamespaceWithoutClaims(t *testing.T) {
	n := newTenantNode(t)
	ctx := context.Background()
	a := mpsShareClaim("team-a", "one", "gpu-2-mps-0")
	n.prepare(t, a)
	// Another agent's manager started team-b's daemon, whose claim this checkpoint never held.
	other := mps.New(mps.Config{Control: n.fake.Path, Root: n.root, Runner: runner.Exec{}})
	if _, err := other.EnsureTenant(ctx, mpsGPU2, "team-b", mps.Settings{}); err != nil {
		t.Fatal(err)
	}
	n.wantTenants(t, "before the sync", "team-a", "team-b")
	dra.SyncMPSTenants(ctx, n.p)
	n.wantTenants(t, "after the sync", "team-a")
}

// In compute mode EXCLUSIVE_PROCESS one MPS server holds the GPU, so one namespace's daemon at a time:
// the first namespace's claims hold its MPS shares until the last of them goes, and another namespace's
// claim is refused with a reason until then.
func TestOnAnExclusiveProcessGPUOneNamespaceHoldsTheMPSSharesAtATime(t *testing.T) {
	n := newTenantNode(t)
	st := mixedNode()
	for i := range st.GPUs {
		if st.GPUs[i].UUID == mpsGPU2 {
			st.GPUs[i].ComputeMode = "ExclusiveProcess"
		}
	}
	n.p.Update(st)
	a1, a2 := mpsShareClaim("team-a", "one", "gpu-2-mps-0"), mpsShareClaim("team-a", "two", "gpu-2-mps-1")
	b := mpsShareClaim("team-b", "one", "gpu-2-mps-2")
	n.prepare(t, a1)
	n.prepare(t, a2)
	err := prepareOne(context.Background(), n.p, b)
	if !errors.Is(err, dra.ErrMPSGPUHeldByNamespace) || !strings.Contains(err.Error(), "namespace team-a") {
		t.Fatalf("team-b's claim on team-a's EXCLUSIVE_PROCESS GPU: %v, want ErrMPSGPUHeldByNamespace naming team-a", err)
	}
	n.wantTenants(t, "team-b refused", "team-a")
	n.unprepare(t, a1)
	if err := prepareOne(context.Background(), n.p, b); !errors.Is(err, dra.ErrMPSGPUHeldByNamespace) {
		t.Fatalf("team-b's claim while team-a still holds one: %v, want ErrMPSGPUHeldByNamespace", err)
	}
	n.unprepare(t, a2)
	n.prepare(t, b)
	n.wantTenants(t, "team-a's claims gone", "team-b")
}

// daemonPID is the namespace's daemon's pid on GPU 2, from the agent's record.
func daemonPID(t *testing.T, root, ns string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, mpsGPU2, "ns", ns, "daemon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
