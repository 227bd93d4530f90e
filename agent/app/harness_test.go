package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// testNode is one agent built by Setup, as cmd/agent builds it, over a mock DGX A100, fake host tools, a
// fake kubelet (device plugin registration and PodResources) and the real API server.
type testNode struct {
	name    string
	dir     string
	gpus    *nvmlmock.Server
	events  *nvmlmock.Events
	kubelet *fakekubelet.Kubelet
	pods    *fakekubelet.PodResources
	mpsCtl  *fakebin.Fake
	// isolatedMPS: the daemons run through the launcher, each with its GPU's tmpfs as /dev/shm.
	isolatedMPS bool
}

var nodeSeq int

// startNode runs an agent until the test ends. The socket directory comes from os.MkdirTemp("", "x"):
// t.TempDir() paths can exceed the 108-byte limit of a Unix socket path.
func startNode(t *testing.T, gpus int) *testNode {
	t.Helper()
	return startNodeWith(t, gpus, nil)
}

// startNodeWith is startNode with Setup's options changed by with (nil: none).
func startNodeWith(t *testing.T, gpus int, with func(*Options)) *testNode {
	t.Helper()
	dir, err := os.MkdirTemp("", "x")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	nodeSeq++
	n := &testNode{name: fmt.Sprintf("agent-node-%d", nodeSeq), dir: dir, gpus: nvmlmock.NewA100(gpus)}
	// Distinct uuids per node, as on a real fleet.
	for i, g := range n.gpus.GPUs {
		g.Device.UUID = fmt.Sprintf("GPU-%08d-%04d-4000-8000-000000000000", nodeSeq, i)
	}
	n.events = nvmlmock.NewEvents(n.gpus)
	dpDir := filepath.Join(dir, "dp")
	if err := os.Mkdir(dpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if n.kubelet, err = fakekubelet.Start(dpDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.kubelet.Stop)
	if n.pods, err = fakekubelet.StartPodResources(filepath.Join(dir, "pr.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.pods.Stop)
	n.mpsCtl = fakebin.MPSControl(t, dir)
	smi := fakebin.NvidiaSMI(t, dir, false)

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   CacheOptions(n.name),
	})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		NodeName:           n.name,
		GPU:                gpu.NewNVML(n.gpus),
		MPSRoot:            filepath.Join(dir, "mps"),
		SchedulerRoot:      filepath.Join(dir, "s"),
		StateDir:           filepath.Join(dir, "state"),
		MPSControl:         n.mpsCtl.Path,
		NvidiaSMI:          smi.Path,
		Resync:             time.Minute,
		SkipNameValidation: true,
		DevicePlugin:       &share.Config{SocketDir: dpDir, KubeletPollInterval: 100 * time.Millisecond},
		PodResourcesSocket: n.pods.Path(),
		DrainPollInterval:  100 * time.Millisecond,
		// Long enough that a test sees no retry after a failed drain.
		DrainBackoff: time.Hour,
		Health:       &HealthOptions{},
	}
	// As root the daemons run as in production, each in its namespace with its GPU's tmpfs as /dev/shm;
	// otherwise without (mps.Config.Launcher), and the tests that need the tmpfs check nothing of it.
	if os.Geteuid() == 0 {
		if opts.MPSLauncher, err = os.Executable(); err != nil {
			t.Fatal(err)
		}
		opts.MPSShmSize = 16 << 20
		n.isolatedMPS = true
	}
	if with != nil {
		with(&opts)
	}
	err = Setup(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent manager: %v", err)
		}
	})
	n.waitFor(t, "the agent creates its GPUNode", func(g *v1alpha1.GPUNode) (bool, string) {
		return len(g.Status.GPUs) == gpus, fmt.Sprintf("%d GPUs in status", len(g.Status.GPUs))
	})
	return n
}

func (n *testNode) uuid(i int) string { return n.gpus.GPUs[i].UUID }

// get reads the node's GPUNode.
func (n *testNode) get(t *testing.T) *v1alpha1.GPUNode {
	t.Helper()
	g := &v1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: n.name}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

// setSpec writes spec.gpus as the controller would.
func (n *testNode) setSpec(t *testing.T, gpus ...v1alpha1.GPUDesired) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		g := &v1alpha1.GPUNode{}
		if err := env.Client.Get(context.Background(), types.NamespacedName{Name: n.name}, g); err != nil {
			return err
		}
		g.Spec.GPUs = gpus
		return env.Client.Update(context.Background(), g)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitFor polls the GPUNode until ok holds and returns it; it fails the test with the last explanation
// otherwise.
func (n *testNode) waitFor(t *testing.T, what string, ok func(*v1alpha1.GPUNode) (bool, string)) *v1alpha1.GPUNode {
	t.Helper()
	var got *v1alpha1.GPUNode
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		g := &v1alpha1.GPUNode{}
		if err := env.Client.Get(context.Background(), types.NamespacedName{Name: n.name}, g); err != nil {
			return false, err.Error()
		}
		done, state := ok(g)
		if done {
			got = g
		}
		return done, state
	}, "%s", what)
	return got
}

// reconciled makes the agent look at its GPUNode once more (a label changes, the spec does not) and
// waits until the agent's controller has counted a reconcile since: a "nothing happened" check made
// after it knows the agent had its chance to act.
func (n *testNode) reconciled(t *testing.T) {
	t.Helper()
	before := testenv.Reconciles(t, "gpunode-agent")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		g := &v1alpha1.GPUNode{}
		if err := env.Client.Get(context.Background(), types.NamespacedName{Name: n.name}, g); err != nil {
			return err
		}
		if g.Labels == nil {
			g.Labels = map[string]string{}
		}
		g.Labels["test.gpusharing.io/poke"] = fmt.Sprint(time.Now().UnixNano())
		return env.Client.Update(context.Background(), g)
	})
	if err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got := testenv.Reconciles(t, "gpunode-agent")
		return got > before, fmt.Sprintf("%v reconciles, %v before the poke", got, before)
	}, "the agent reconciled its GPUNode after a label change")
}

// drainPolled waits until the kubelet's PodResources answered four more List calls: a running drain
// lists the pods on its GPU at each poll (the device plugin's check of a cordoned GPU lists too, at the
// same 100 ms pace), so the drain has polled since and acted on what it found.
func (n *testNode) drainPolled(t *testing.T) {
	t.Helper()
	base := n.pods.Lists()
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		return n.pods.Lists() >= base+4, fmt.Sprintf("%d lists since", n.pods.Lists()-base)
	}, "the drain polled the kubelet")
}

// waitDevices polls the kubelet's view of resource until it equals want (device ID -> health).
func (n *testNode) waitDevices(t *testing.T, what, resource string, want map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(want) == 0 {
		wait.UntilState(t, 30*time.Second, func() (bool, string) {
			got := n.kubelet.Devices(resource)
			return len(got) == 0, fmt.Sprintf("kubelet's %s: %v", resource, got)
		}, "%s", what)
		return
	}
	if err := n.kubelet.WaitForDevices(ctx, resource, want); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// gpuState finds a GPU in status.
func gpuState(g *v1alpha1.GPUNode, uuid string) *v1alpha1.GPUStatus {
	for i := range g.Status.GPUs {
		if g.Status.GPUs[i].UUID == uuid {
			return &g.Status.GPUs[i]
		}
	}
	return nil
}

// applied is the GPU's Applied condition as "Status/Reason: message".
func applied(g *v1alpha1.GPUNode, uuid string) (reason string, status metav1.ConditionStatus, msg string) {
	st := gpuState(g, uuid)
	if st == nil {
		return "<no GPU>", "", ""
	}
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionApplied)
	if c == nil {
		return "<none>", "", ""
	}
	return c.Reason, c.Status, c.Message
}

// appliedAsDesired is a waitFor check: every listed uuid reports Applied=True AsDesired.
func appliedAsDesired(uuids ...string) func(*v1alpha1.GPUNode) (bool, string) {
	return func(g *v1alpha1.GPUNode) (bool, string) {
		var out []string
		ok := true
		for _, u := range uuids {
			reason, _, msg := applied(g, u)
			out = append(out, u+": "+reason+": "+msg)
			ok = ok && reason == v1alpha1.ReasonAsDesired
		}
		return ok, strings.Join(out, "; ")
	}
}

// replicas is the kubelet's expected view of n healthy replicas of a GPU.
func replicas(uuid string, n int32, into map[string]string) map[string]string {
	if into == nil {
		into = map[string]string{}
	}
	for i := int32(0); i < n; i++ {
		into[share.ReplicaID(uuid, i)] = "Healthy"
	}
	return into
}

func migSharing(profile string, count int32) v1alpha1.Sharing {
	return v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{Instances: []v1alpha1.MIGInstanceRequest{{Profile: profile, Count: count}}}}
}

func mpsSharing(replicas int32) v1alpha1.Sharing {
	q := resource.MustParse("1Gi")
	return v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: replicas, PinnedMemoryLimit: &q}}
}

func timeSlicing(replicas int32) v1alpha1.Sharing {
	return v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: replicas, Interval: v1alpha1.TimeSliceShort}}
}

func exclusive() v1alpha1.Sharing { return v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive} }

func drainSpec(mode v1alpha1.DrainMode, timeout time.Duration) *v1alpha1.Drain {
	return &v1alpha1.Drain{Mode: mode, Timeout: &metav1.Duration{Duration: timeout}}
}

// runningPod creates a pod, Running and Ready, in a namespace of its own.
func runningPod(t *testing.T, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "agent-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return env.RunningPod(t, ctx, ns.Name, name, labels)
}
