package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
)

// strategyRig is one GPU of a mock DGX A100 with every strategy wired to fakes: no API server.
type strategyRig struct {
	s      *Strategies
	r      *Reconciler
	server *nvmlmock.Server
	mpsCtl *fakebin.Fake
	smi    *fakebin.Fake
}

func newStrategyRig(t *testing.T) *strategyRig {
	t.Helper()
	dir := t.TempDir()
	rig := &strategyRig{server: nvmlmock.NewA100(1), mpsCtl: fakebin.MPSControl(t, dir), smi: fakebin.NvidiaSMI(t, dir, false)}
	iface := gpu.NewNVML(rig.server)
	// A Unix socket path must fit in 108 bytes: the scheduler root is short, not under t.TempDir.
	root, err := os.MkdirTemp("", "s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	sh := &ShimSchedulers{Root: root, Reserve: DefaultOversubReserve}
	rig.s = &Strategies{
		GPU:       iface,
		MIG:       &mig.Applier{GPU: iface},
		MPS:       mps.New(mps.Config{Control: rig.mpsCtl.Path, Root: filepath.Join(dir, "mps"), Runner: runner.Exec{}, Clock: clocktesting.NewFakeClock(time.Unix(1e9, 0))}),
		TimeSlice: &timeslice.Manager{SMI: rig.smi.Path, StateDir: filepath.Join(dir, "timeslice"), Runner: runner.Exec{}},
		Shim:      sh,
	}
	rig.r = &Reconciler{Strategies: *rig.s}
	t.Cleanup(func() {
		for _, uuid := range []string{rig.uuid()} {
			_ = sh.Stop(context.Background(), uuid)
			_ = rig.s.MPS.Stop(context.Background(), uuid)
		}
	})
	return rig
}

func (rig *strategyRig) uuid() string { return rig.server.GPUs[0].UUID }

func (rig *strategyRig) device(t *testing.T) gpu.Device {
	t.Helper()
	d, err := rig.s.GPU.Device(context.Background(), rig.uuid())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (rig *strategyRig) converge(t *testing.T, want v1alpha1.Sharing) error {
	t.Helper()
	return rig.s.converge(context.Background(), rig.device(t), want)
}

// inForce is what the GPU runs as status would report it: the strategy and whether the shim's
// scheduler runs.
func (rig *strategyRig) inForce(t *testing.T) (v1alpha1.Strategy, bool) {
	t.Helper()
	a := applied(rig.device(t), rig.r.observe(rig.uuid()))
	return a.Strategy, a.Shim != nil
}

// quiet asserts that nothing changed since the last look: no mutating NVML call, no host command.
func (rig *strategyRig) quiet(t *testing.T, when string) {
	t.Helper()
	if c := rig.server.GPUs[0].Calls(); len(c) > 0 {
		t.Errorf("%s: NVML changes %v, want none", when, c)
	}
	if c := rig.mpsCtl.Calls(t); len(c) > 0 {
		t.Errorf("%s: MPS control calls %v, want none", when, c)
	}
	if c := rig.smi.Calls(t); len(c) > 0 {
		t.Errorf("%s: nvidia-smi calls %v, want none", when, c)
	}
}

func (rig *strategyRig) forget(t *testing.T) {
	rig.server.GPUs[0].Calls()
	rig.mpsCtl.Calls(t)
	rig.smi.Calls(t)
}

var conformanceSharings = []struct {
	name string
	s    v1alpha1.Sharing
}{
	{"Exclusive", v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive}},
	{"Exclusive+shim", v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive, Oversubscription: &v1alpha1.Oversubscription{}}},
	{"TimeSlicing", v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2, Interval: v1alpha1.TimeSliceShort}}},
	{"TimeSlicing+shim", v1alpha1.Sharing{Strategy: v1alpha1.StrategyTimeSlicing, TimeSlicing: &v1alpha1.TimeSlicingSharing{Replicas: 2, Interval: v1alpha1.TimeSliceLong},
		Oversubscription: &v1alpha1.Oversubscription{TimeQuantum: &metav1.Duration{Duration: 3 * time.Second}}}},
	{"MPS", v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 2}}},
	{"MIG", migSharing("3g.20gb x1 + 1g.5gb x2")},
}

// TestEveryStrategyConvergesFromEveryOther goes from each sharing to each other on real
// implementations over the mock GPU and fake tools: afterwards exactly the target's strategies are in
// force (the others torn down), and a second converge changes nothing. Only a whole-GPU sharing may
// follow MIG: MPS and time-slicing are refused with nothing changed.
func TestEveryStrategyConvergesFromEveryOther(t *testing.T) {
	for _, from := range conformanceSharings {
		for _, to := range conformanceSharings {
			t.Run(from.name+"->"+to.name, func(t *testing.T) {
				rig := newStrategyRig(t)
				if err := rig.converge(t, from.s); err != nil {
					t.Fatalf("converging to %s: %v", from.name, err)
				}
				rig.forget(t)
				err := rig.converge(t, to.s)
				if from.s.Strategy == v1alpha1.StrategyMIG && (to.s.Strategy == v1alpha1.StrategyMPS || to.s.Strategy == v1alpha1.StrategyTimeSlicing) {
					if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonStrategyNeedsMIGDisabled {
						t.Fatalf("MIG -> %s: err %v, want StrategyNeedsMIGDisabled", to.name, err)
					}
					rig.quiet(t, "a refused change")
					if s, _ := rig.inForce(t); s != v1alpha1.StrategyMIG {
						t.Errorf("after a refused change the GPU runs %s, want MIG as it was", s)
					}
					return
				}
				if err != nil {
					t.Fatalf("converging %s -> %s: %v", from.name, to.name, err)
				}
				s, shim := rig.inForce(t)
				if s != to.s.Strategy || shim != (to.s.Oversubscription != nil) {
					t.Errorf("in force: %s (shim scheduler %v), want %s (shim scheduler %v)", s, shim, to.s.Strategy, to.s.Oversubscription != nil)
				}
				if _, ok := rig.s.MPS.Status(rig.uuid()); ok != (to.s.Strategy == v1alpha1.StrategyMPS) {
					t.Errorf("MPS daemon known to the manager: %v", ok)
				}
				rig.forget(t)
				if err := rig.converge(t, to.s); err != nil {
					t.Fatalf("second converge: %v", err)
				}
				rig.quiet(t, "a second converge")
			})
		}
	}
}

// TestInvalidSharingsAreTerminal pins that a sharing no agent could apply gets InvalidSharing, an
// outcome (not retried with backoff), and changes nothing.
func TestInvalidSharingsAreTerminal(t *testing.T) {
	for _, s := range []v1alpha1.Sharing{
		{Strategy: v1alpha1.StrategyMIG},
		{Strategy: v1alpha1.StrategyMPS},
		{Strategy: v1alpha1.StrategyTimeSlicing},
		{Strategy: "Shared"},
	} {
		rig := newStrategyRig(t)
		err := rig.converge(t, s)
		if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonInvalidSharing || transient(err) {
			t.Errorf("%s without its block: err %v, want a terminal InvalidSharing", s.Strategy, err)
		}
		rig.quiet(t, "an invalid sharing")
	}
}

// TestAdmitIsWhatConvergeAndTheDrainAsk pins the one decision: a GPU that cannot take a sharing is
// refused by Admit with the same outcome converge returns.
func TestAdmitIsWhatConvergeAndTheDrainAsk(t *testing.T) {
	rig := newStrategyRig(t)
	rig.server.GPUs[0].SetMIGMode(true, true)
	dev := rig.device(t)
	for _, tt := range []struct {
		s      v1alpha1.Sharing
		reason string
	}{
		{conformanceSharings[4].s, v1alpha1.ReasonStrategyNeedsMIGDisabled},
		{conformanceSharings[2].s, v1alpha1.ReasonStrategyNeedsMIGDisabled},
		{migSharing("3g.20gb x1 + 1g.10gb x4"), v1alpha1.ReasonLayoutDoesNotFit},
		{v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive}, ""},
	} {
		_, admitErr := rig.s.Admit(dev, tt.s)
		convergeErr := rig.s.converge(context.Background(), dev, tt.s)
		for what, err := range map[string]error{"Admit": admitErr, "converge": convergeErr} {
			got := ""
			if o, ok := outcome.As(err); ok {
				got = o.Reason
			} else if err != nil {
				got = err.Error()
			}
			if got != tt.reason {
				t.Errorf("%s of %s: %q, want %q", what, tt.s.Strategy, got, tt.reason)
			}
		}
	}
}

// With MPSExclusiveProcess (the manifests' default), MPS puts the GPU in EXCLUSIVE_PROCESS compute mode
// (mpsStrategy.Apply does it before it starts the daemon), so a client that bypasses the daemon cannot open a context of its own, and
// leaving MPS restores Default after the daemon quit. Without it, compute mode is never touched.
func TestMPSExclusiveProcessSetsAndRestoresTheComputeMode(t *testing.T) {
	mpsSharing := conformanceSharings[4].s
	exclusive := conformanceSharings[0].s
	for _, on := range []bool{true, false} {
		rig := newStrategyRig(t)
		rig.s.MPSExclusiveProcess = on
		if err := rig.converge(t, mpsSharing); err != nil {
			t.Fatal(err)
		}
		calls := rig.server.GPUs[0].Calls()
		mode := rig.device(t).ComputeMode
		if on && (len(calls) != 1 || calls[0] != "SetComputeMode(3)" || mode != gpu.ComputeModeExclusiveProcess) {
			t.Errorf("on, entering MPS: NVML calls %v, compute mode %s; want SetComputeMode(3), ExclusiveProcess", calls, mode)
		}
		if !on && (len(calls) != 0 || mode != gpu.ComputeModeDefault) {
			t.Errorf("off, entering MPS: NVML calls %v, compute mode %s; want none, Default", calls, mode)
		}
		rig.forget(t)
		if err := rig.converge(t, mpsSharing); err != nil {
			t.Fatal(err)
		}
		rig.quiet(t, "MPS again")
		if err := rig.converge(t, exclusive); err != nil {
			t.Fatal(err)
		}
		calls, mode = rig.server.GPUs[0].Calls(), rig.device(t).ComputeMode
		if on && (len(calls) != 1 || calls[0] != "SetComputeMode(0)" || mode != gpu.ComputeModeDefault) {
			t.Errorf("on, leaving MPS: NVML calls %v, compute mode %s; want SetComputeMode(0), Default", calls, mode)
		}
		if !on && len(calls) != 0 {
			t.Errorf("off, leaving MPS: NVML calls %v, want none", calls)
		}
	}
}

// A device with consumable capacity must hold the minimum plus one step, or the API server refuses the
// node's whole ResourceSlice: the agent refuses such sizes before it touches the GPU, with the sizes in
// the message.
func TestAdmitRefusesSizesTheGPUCannotHold(t *testing.T) {
	var s Strategies
	dev := gpu.Device{Index: 0, UUID: "GPU-a", MemoryBytes: 40 << 30}
	for _, tt := range []struct {
		step, min string
		reason    string
	}{
		{"1Gi", "", ""},
		{"20Gi", "20Gi", ""},
		{"21Gi", "", v1alpha1.ReasonSizingDoesNotFit},
		{"24Gi", "24Gi", v1alpha1.ReasonSizingDoesNotFit},
		{"1Ti", "", v1alpha1.ReasonSizingDoesNotFit},
	} {
		want := sizedMPS(tt.step)
		if tt.min != "" {
			q := resource.MustParse(tt.min)
			want.Sizing.MinMemory = &q
		}
		_, err := s.Admit(dev, want)
		got := ""
		if o, ok := outcome.As(err); ok {
			got = o.Reason
			if !strings.Contains(o.Message, "this GPU has 40Gi") {
				t.Errorf("step %s, min %s: message %q does not name the GPU's memory", tt.step, tt.min, o.Message)
			}
		} else if err != nil {
			got = err.Error()
		}
		if got != tt.reason {
			t.Errorf("step %s, min %s: Admit %q, want %q", tt.step, tt.min, got, tt.reason)
		}
	}
}
