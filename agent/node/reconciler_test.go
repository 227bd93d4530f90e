package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// agent is a reconciler over a mock DGX with fake host commands, for one test node.
type agent struct {
	r      *Reconciler
	server *nvmlmock.Server
	mpsCtl *fakebin.Fake
	smi    *fakebin.Fake
}

var nodeSeq int

func newAgent(t *testing.T, g func(*nvmlmock.Server) gpu.Interface) *agent {
	t.Helper()
	dir := t.TempDir()
	nodeSeq++
	a := &agent{server: nvmlmock.NewA100(2), mpsCtl: fakebin.MPSControl(t, dir), smi: fakebin.NvidiaSMI(t, dir, false)}
	iface := g(a.server)
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	a.r = &Reconciler{
		Metrics:  m,
		Client:   env.Client,
		NodeName: fmt.Sprintf("gpu-node-%d", nodeSeq),
		Resync:   time.Minute,
		Strategies: Strategies{
			GPU:       iface,
			MIG:       &mig.Applier{GPU: iface},
			MPS:       mps.New(mps.Config{Control: a.mpsCtl.Path, Root: filepath.Join(dir, "mps"), Runner: runner.Exec{}, Clock: clocktesting.NewFakeClock(time.Unix(1e9, 0))}),
			TimeSlice: &timeslice.Manager{SMI: a.smi.Path, StateDir: filepath.Join(dir, "timeslice"), Runner: runner.Exec{}},
		},
	}
	return a
}

func withNVML(s *nvmlmock.Server) gpu.Interface { return gpu.NewNVML(s) }

func (a *agent) pass(t *testing.T) *v1alpha1.GPUNode {
	t.Helper()
	if _, err := a.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: a.r.NodeName}}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	n := &v1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: a.r.NodeName}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (a *agent) setSpec(t *testing.T, gpus ...v1alpha1.GPUDesired) {
	t.Helper()
	n := &v1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: a.r.NodeName}, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.GPUs = gpus
	if err := env.Client.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

func cond(conds []metav1.Condition, typ string) string {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return "<none>"
	}
	return string(c.Status) + "/" + c.Reason
}

func migSharing(spec string) v1alpha1.Sharing {
	s := v1alpha1.Sharing{Strategy: v1alpha1.StrategyMIG, MIG: &v1alpha1.MIGSharing{}}
	for _, part := range strings.Split(spec, " + ") {
		var in v1alpha1.MIGInstanceRequest
		f := strings.Fields(part)
		in.Profile = f[0]
		in.Count = int32(f[1][1] - '0')
		s.MIG.Instances = append(s.MIG.Instances, in)
	}
	return s
}

func mpsSharing(replicas int32, pct int32, limit string) v1alpha1.Sharing {
	q := resource.MustParse(limit)
	return v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: replicas, ActiveThreadPercentage: &pct, PinnedMemoryLimit: &q}}
}

func TestAgentCreatesItsGPUNodeAndPublishesInventory(t *testing.T) {
	a := newAgent(t, withNVML)
	n := a.pass(t)
	st := n.Status
	if st.GPUCount != 2 || st.DriverVersion != "550.54.15" || st.CUDAVersion != "12.4" || len(st.GPUs) != 2 {
		t.Fatalf("status = count %d driver %q cuda %q gpus %d", st.GPUCount, st.DriverVersion, st.CUDAVersion, len(st.GPUs))
	}
	if got := cond(st.Conditions, v1alpha1.ConditionReady); got != "True/InventoryPublished" {
		t.Errorf("Ready = %s", got)
	}
	if got := cond(st.Conditions, v1alpha1.ConditionApplied); got != "True/NotDesired" {
		t.Errorf("Applied = %s", got)
	}
	g := st.GPUs[0]
	if g.UUID != a.server.GPUs[0].UUID || g.Product != "NVIDIA A100-SXM4-40GB" || !g.MIGCapable || g.MIGMode.Current != "Disabled" || len(g.MIGProfiles) != 7 {
		t.Errorf("GPU 0 = %+v", g)
	}
	if st.Summary != "0-1:Exclusive" {
		t.Errorf("summary = %q", st.Summary)
	}
	rv := n.ResourceVersion
	if n = a.pass(t); n.ResourceVersion != rv {
		t.Errorf("a pass with nothing new wrote status (resourceVersion %s -> %s)", rv, n.ResourceVersion)
	}
}

func TestAgentOwnsItsGPUNodeByTheNode(t *testing.T) {
	a := newAgent(t, withNVML)
	k8sNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.r.NodeName}}
	if err := env.Client.Create(context.Background(), k8sNode); err != nil {
		t.Fatal(err)
	}
	n := a.pass(t)
	if len(n.OwnerReferences) != 1 || n.OwnerReferences[0].Kind != "Node" || n.OwnerReferences[0].UID != k8sNode.UID {
		t.Errorf("owner references = %+v, want the Node", n.OwnerReferences)
	}
}

func TestAgentAppliesPerGPUSharingAndASecondPassChangesNothing(t *testing.T) {
	a := newAgent(t, withNVML)
	a.pass(t)
	want0 := migSharing("3g.20gb x1 + 1g.5gb x4")
	want1 := mpsSharing(4, 25, "8Gi")
	a.setSpec(t,
		v1alpha1.GPUDesired{UUID: a.server.GPUs[0].UUID, Index: 0, Policy: "inference", PolicyGeneration: 3, Sharing: want0},
		v1alpha1.GPUDesired{UUID: a.server.GPUs[1].UUID, Index: 1, Policy: "inference", PolicyGeneration: 3, Sharing: want1},
	)
	n := a.pass(t)
	st := n.Status
	if st.AppliedGPUs != 2 || cond(st.Conditions, v1alpha1.ConditionApplied) != "True/AsDesired" || st.ObservedGeneration != n.Generation {
		t.Fatalf("node status = applied %d, Applied %s, observedGeneration %d/%d", st.AppliedGPUs, cond(st.Conditions, v1alpha1.ConditionApplied), st.ObservedGeneration, n.Generation)
	}
	if st.Summary != "0:MIG(1g.5gb×4,3g.20gb) 1:MPS×4" {
		t.Errorf("summary = %q", st.Summary)
	}
	g0, g1 := st.GPUs[0], st.GPUs[1]
	if g0.Applied.SpecHash != v1alpha1.SharingHash(want0) || g0.Applied.Policy != "inference" || g0.Applied.PolicyGeneration != 3 || len(g0.Applied.MIGInstances) != 5 {
		t.Errorf("GPU 0 applied = %+v", g0.Applied)
	}
	for _, in := range g0.Applied.MIGInstances {
		if in.UUID == "" {
			t.Errorf("MIG instance without uuid: %+v", in)
		}
	}
	mpsSt := g1.Applied.MPS
	if g1.Applied.SpecHash != v1alpha1.SharingHash(want1) || mpsSt == nil || mpsSt.State != "Running" || mpsSt.PID == 0 || mpsSt.Replicas != 4 ||
		mpsSt.ActiveThreadPercentage != 25 || mpsSt.PinnedMemoryLimit.String() != "8Gi" {
		t.Errorf("GPU 1 applied = %+v, mps %+v", g1.Applied, mpsSt)
	}
	if got := prom.GaugeValue(t, a.r.Metrics.appliedGPUs.WithLabelValues(a.r.NodeName)); got != 2 {
		t.Errorf("gpusharing_agent_applied_gpus = %v, want 2", got)
	}
	if got := prom.GaugeValue(t, a.r.Metrics.gpuApplied.WithLabelValues(a.r.NodeName, a.server.GPUs[1].UUID)); got != 1 {
		t.Errorf("gpusharing_agent_gpu_applied for GPU 1 = %v, want 1", got)
	}
	a.mpsCtl.Calls(t)
	a.server.GPUs[0].Calls()
	rv := n.ResourceVersion

	n = a.pass(t)
	if n.ResourceVersion != rv {
		t.Errorf("second pass wrote status")
	}
	if calls := a.mpsCtl.Calls(t); len(calls) != 0 {
		t.Errorf("second pass ran MPS commands: %q", calls)
	}
	if calls := a.server.GPUs[0].Calls(); len(calls) != 0 {
		t.Errorf("second pass changed the MIG GPU: %q", calls)
	}
}

func TestAgentReportsWhyAGPUIsNotAsDesired(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*nvmlmock.Server)
		sharing v1alpha1.Sharing
		reason  string
		message string
		summary string
	}{
		{"layout that does not fit", func(*nvmlmock.Server) {}, migSharing("3g.20gb x1 + 1g.10gb x4"),
			v1alpha1.ReasonLayoutDoesNotFit, "1g.10gb x4 needs placements at {0,2,4,6}", "0:Exclusive!LayoutDoesNotFit 1:Exclusive"},
		{"MIG on a GPU without MIG", func(s *nvmlmock.Server) { s.GPUs[0].SetMIGCapable(false) }, migSharing("1g.5gb x1"),
			v1alpha1.ReasonNotMIGCapable, "does not support MIG", "0:Exclusive!NotMIGCapable 1:Exclusive"},
		{"MPS on a GPU with MIG on", func(s *nvmlmock.Server) { s.GPUs[0].SetMIGMode(true, true) }, mpsSharing(2, 50, "1Gi"),
			v1alpha1.ReasonStrategyNeedsMIGDisabled, "MPS needs MIG mode disabled on GPU 0", "0:MIG(none)!StrategyNeedsMIGDisabled 1:Exclusive"},
		{"busy GPU", func(s *nvmlmock.Server) { s.GPUs[0].SetProcesses(777) }, migSharing("7g.40gb x1"),
			v1alpha1.ReasonGPUBusy, "pids [777]", "0:Exclusive!GPUBusy 1:Exclusive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, withNVML)
			tt.setup(a.server)
			a.pass(t)
			a.setSpec(t, v1alpha1.GPUDesired{UUID: a.server.GPUs[0].UUID, Sharing: tt.sharing})
			st := a.pass(t).Status
			g := st.GPUs[0]
			c := meta.FindStatusCondition(g.Conditions, v1alpha1.ConditionApplied)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != tt.reason || !strings.Contains(c.Message, tt.message) {
				t.Errorf("GPU Applied = %+v, want False/%s containing %q", c, tt.reason, tt.message)
			}
			if got := cond(st.Conditions, v1alpha1.ConditionApplied); got != "False/"+tt.reason {
				t.Errorf("node Applied = %s", got)
			}
			if g.Applied.SpecHash != "" || st.AppliedGPUs != 0 {
				t.Errorf("a GPU not as desired reports specHash %q, appliedGPUs %d", g.Applied.SpecHash, st.AppliedGPUs)
			}
			if tt.reason == v1alpha1.ReasonGPUBusy && !reflect.DeepEqual(g.Processes, []int32{777}) {
				t.Errorf("processes = %v", g.Processes)
			}
			if st.Summary != tt.summary {
				t.Errorf("summary = %q, want %q", st.Summary, tt.summary)
			}
		})
	}
}

func TestLeavingMPSQuitsTheDaemonAndSetsTheTimeSlice(t *testing.T) {
	a := newAgent(t, withNVML)
	a.pass(t)
	uuid := a.server.GPUs[1].UUID
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 1, Sharing: mpsSharing(2, 50, "1Gi")})
	a.pass(t)
	a.mpsCtl.Calls(t)
	ts := v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 4, Interval: v1alpha1.TimeSliceLong}}
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 1, Sharing: ts})
	st := a.pass(t).Status

	mpsCalls := a.mpsCtl.Calls(t)
	if len(mpsCalls) != 2 || !strings.HasPrefix(mpsCalls[0], "nvidia-cuda-mps-control <<< get_server_list") || !strings.HasPrefix(mpsCalls[1], "nvidia-cuda-mps-control <<< quit") {
		t.Errorf("MPS commands = %q, want get_server_list then quit", mpsCalls)
	}
	if got, want := a.smi.Calls(t), []string{"nvidia-smi compute-policy -i " + uuid + " --set-timeslice=3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("nvidia-smi = %q, want %q", got, want)
	}
	if st.Summary != "0:Exclusive 1:TimeSlicing×4" || st.GPUs[1].Applied.TimeSlicing.Interval != v1alpha1.TimeSliceLong {
		t.Errorf("summary = %q, applied = %+v", st.Summary, st.GPUs[1].Applied)
	}

	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 1, Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive}})
	st = a.pass(t).Status
	if got, want := a.smi.Calls(t), []string{"nvidia-smi compute-policy -i " + uuid + " --set-timeslice=0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("back to Exclusive: nvidia-smi = %q, want %q", got, want)
	}
	if st.Summary != "0-1:Exclusive" || cond(st.GPUs[1].Conditions, v1alpha1.ConditionApplied) != "True/AsDesired" {
		t.Errorf("summary = %q, GPU 1 Applied = %s", st.Summary, cond(st.GPUs[1].Conditions, v1alpha1.ConditionApplied))
	}
}

func TestExclusiveTearsDownMIG(t *testing.T) {
	a := newAgent(t, withNVML)
	a.pass(t)
	uuid := a.server.GPUs[0].UUID
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: migSharing("3g.20gb x2")})
	a.pass(t)
	a.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive}})
	st := a.pass(t).Status
	g := st.GPUs[0]
	if g.MIGMode.Current != "Disabled" || len(g.Applied.MIGInstances) != 0 || cond(g.Conditions, v1alpha1.ConditionApplied) != "True/AsDesired" {
		t.Errorf("after Exclusive: mode %+v, instances %v, Applied %s", g.MIGMode, g.Applied.MIGInstances, cond(g.Conditions, v1alpha1.ConditionApplied))
	}
}

func TestNodesWithoutNVMLOrGPUsReportReadiness(t *testing.T) {
	tests := []struct {
		name  string
		gpu   func(*nvmlmock.Server) gpu.Interface
		ready string
		count int32
	}{
		{"no NVML", func(*nvmlmock.Server) gpu.Interface {
			return gpu.Null{Cause: errors.New("libnvidia-ml.so.1: cannot open shared object file")}
		}, "False/NVMLUnavailable", 0},
		{"no GPUs", func(s *nvmlmock.Server) gpu.Interface {
			s.Devices = nil
			return gpu.NewNVML(s)
		}, "True/NoGPUs", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, tt.gpu)
			st := a.pass(t).Status
			if got := cond(st.Conditions, v1alpha1.ConditionReady); got != tt.ready || st.GPUCount != tt.count {
				t.Errorf("Ready = %s, gpuCount %d; want %s, %d", got, st.GPUCount, tt.ready, tt.count)
			}
		})
	}
}

func TestAgentRunsUnderTheManagerAndCreatesItsGPUNode(t *testing.T) {
	a := newAgent(t, withNVML)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	a.r.Client = mgr.GetClient()
	// controller-runtime refuses a second controller of one name in a process; -count runs this again.
	a.r.SkipNameValidation = true
	if err := a.r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- mgr.Start(ctx) }()
	defer func() { cancel(); <-done }()

	wait.For(t, 30*time.Second, func() error {
		n := &v1alpha1.GPUNode{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: a.r.NodeName}, n); err != nil {
			return err
		}
		if n.Status.GPUCount != 2 {
			return fmt.Errorf("status %+v", n.Status)
		}
		return nil
	}, "the agent's GPUNode lists its 2 GPUs")
}

// failingMIGMode is a GPU whose MIG mode cannot be set, as when the driver refuses.
type failingMIGMode struct{ gpu.Interface }

func (failingMIGMode) SetMIGMode(context.Context, string, bool) error {
	return &gpu.NVMLError{Op: "SetMigMode(1)", Return: nvml.ERROR_NO_PERMISSION}
}

func TestATransientFailureIsPublishedAndRetried(t *testing.T) {
	a := newAgent(t, func(s *nvmlmock.Server) gpu.Interface { return failingMIGMode{gpu.NewNVML(s)} })
	a.pass(t)
	a.setSpec(t, v1alpha1.GPUDesired{UUID: a.server.GPUs[0].UUID, Sharing: migSharing("7g.40gb x1")})
	_, err := a.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: a.r.NodeName}})
	if !gpu.IsNVMLError(err) {
		t.Fatalf("Reconcile err = %v, want the NVML error returned for a retry with backoff", err)
	}
	n := &v1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: a.r.NodeName}, n); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(n.Status.GPUs[0].Conditions, v1alpha1.ConditionApplied)
	if c == nil || c.Reason != v1alpha1.ReasonNVMLError || !strings.Contains(c.Message, "SetMigMode(1)") {
		t.Errorf("GPU Applied = %+v, want NVMLError naming the call", c)
	}
	if n.Status.ObservedGeneration == n.Generation {
		t.Errorf("observedGeneration advanced to %d on a pass that failed", n.Generation)
	}
}
