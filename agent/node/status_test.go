package node

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

type gpuOpt func(*v1alpha1.GPUStatus)

func gpuAt(index int32, opts ...gpuOpt) v1alpha1.GPUStatus {
	g := v1alpha1.GPUStatus{Index: index, Applied: &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive}}
	for _, o := range opts {
		o(&g)
	}
	return g
}

func withMIG(profiles ...string) gpuOpt {
	return func(g *v1alpha1.GPUStatus) {
		g.Applied.Strategy = v1alpha1.StrategyMIG
		for _, p := range profiles {
			g.Applied.MIGInstances = append(g.Applied.MIGInstances, v1alpha1.MIGInstanceStatus{Profile: p})
		}
	}
}

func withMPS(replicas int32) gpuOpt {
	return func(g *v1alpha1.GPUStatus) {
		g.Applied.Strategy = v1alpha1.StrategyMPS
		g.Applied.MPS = &v1alpha1.MPSStatus{Replicas: replicas}
	}
}

func withTimeSlicing(replicas int32) gpuOpt {
	return func(g *v1alpha1.GPUStatus) {
		g.Applied.Strategy = v1alpha1.StrategyTimeSlicing
		g.Applied.TimeSlicing = &v1alpha1.TimeSlicingSharing{Replicas: replicas}
	}
}

// withShim marks the GPU's shim scheduler as running (oversubscription in force).
func withShim() gpuOpt {
	return func(g *v1alpha1.GPUStatus) {
		g.Applied.Shim = &v1alpha1.ShimStatus{AntiThrashing: v1alpha1.AntiThrashingAuto}
	}
}

func notApplied(reason string) gpuOpt {
	return func(g *v1alpha1.GPUStatus) {
		g.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionApplied, Status: metav1.ConditionFalse, Reason: reason}}
	}
}

func TestSummaryFoldsRunsOfEqualGPUs(t *testing.T) {
	tests := []struct {
		name string
		gpus []v1alpha1.GPUStatus
		want string
	}{
		{"the issue's example", []v1alpha1.GPUStatus{
			gpuAt(0, withMIG("3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb")), gpuAt(1, withMPS(4)),
			gpuAt(2), gpuAt(3), gpuAt(4), gpuAt(5), gpuAt(6), gpuAt(7),
		}, "0:MIG(3g.40gb,1g.10gb×4) 1:MPS×4 2-7:Exclusive"},
		{"unordered input is sorted by index", []v1alpha1.GPUStatus{gpuAt(1), gpuAt(0)}, "0-1:Exclusive"},
		{"a GPU not as desired breaks a run and says why", []v1alpha1.GPUStatus{gpuAt(0), gpuAt(1, notApplied("GPUBusy")), gpuAt(2)},
			"0:Exclusive 1:Exclusive!GPUBusy 2:Exclusive"},
		{"a gap in indices breaks a run", []v1alpha1.GPUStatus{gpuAt(0), gpuAt(2)}, "0:Exclusive 2:Exclusive"},
		{"oversubscription on time-slicing and on a whole GPU is named", []v1alpha1.GPUStatus{
			gpuAt(0, withTimeSlicing(4), withShim()), gpuAt(1, withTimeSlicing(4)), gpuAt(2, withShim()), gpuAt(3),
		}, "0:TimeSlicing×4+Oversub 1:TimeSlicing×4 2:Exclusive+Oversub 3:Exclusive"},
		{"oversubscription that is not yet applied still says why", []v1alpha1.GPUStatus{gpuAt(0, withShim(), notApplied("Draining"))},
			"0:Exclusive+Oversub!Draining"},
		{"no GPUs", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summary(tt.gpus); got != tt.want {
				t.Errorf("Summary = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMPSSettingsDefaultThreadsToAnEqualShare(t *testing.T) {
	pct := int32(30)
	limit := resource.MustParse("18Gi")
	tests := []struct {
		name string
		in   v1alpha1.MPSSharing
		want mps.Settings
	}{
		{"explicit", v1alpha1.MPSSharing{Replicas: 4, ActiveThreadPercentage: &pct, PinnedMemoryLimit: &limit}, mps.Settings{ActiveThreadPercentage: 30, PinnedMemoryLimitMiB: 18432}},
		{"omitted percentage is 100/replicas", v1alpha1.MPSSharing{Replicas: 3}, mps.Settings{ActiveThreadPercentage: 33}},
		{"48 replicas still get 2%", v1alpha1.MPSSharing{Replicas: 48}, mps.Settings{ActiveThreadPercentage: 2}},
	}
	for _, tt := range tests {
		if got := MPSSettings(tt.in); got != tt.want {
			t.Errorf("%s: MPSSettings = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	// Sized per claim, the daemon keeps the GPU's defaults: a client can only lower them, and each claim
	// lowers them to its own size.
	if got := mpsSettingsFor(sizedMPS("1Gi")); got != (mps.Settings{}) {
		t.Errorf("sized MPS: daemon settings %+v, want the GPU's defaults", got)
	}
	if got := mpsSettingsFor(v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 4}}); got.ActiveThreadPercentage != 25 {
		t.Errorf("fixed MPS x4: daemon settings %+v, want 25%% threads", got)
	}
}

func TestReasonForNamesTheCauseOfAFailedPass(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		reason string
	}{
		{"an outcome keeps its reason", outcome.Newf(v1alpha1.ReasonLayoutDoesNotFit, "x"), v1alpha1.ReasonLayoutDoesNotFit},
		{"a wrapped outcome too", errors.Join(errors.New("ctx"), outcome.Newf(v1alpha1.ReasonGPUBusy, "x")), v1alpha1.ReasonGPUBusy},
		{"an NVML failure", &gpu.NVMLError{Op: "GetMigMode", Return: 999}, v1alpha1.ReasonNVMLError},
		{"no NVML", gpu.ErrUnavailable, v1alpha1.ReasonNVMLError},
		{"a failed command", &runner.ExitError{Cmd: runner.Cmd{Path: "nvidia-smi"}, Result: runner.Result{ExitCode: 3}}, v1alpha1.ReasonCommandFailed},
		{"a timed-out command", runner.ErrTimeout, v1alpha1.ReasonCommandFailed},
	}
	for _, tt := range tests {
		if got, _ := reasonFor(tt.err); got != tt.reason {
			t.Errorf("%s: reason = %s, want %s", tt.name, got, tt.reason)
		}
	}
}

func TestHealthyConditionSaysWhetherXidsAreWatched(t *testing.T) {
	dev := gpu.Device{Index: 0, UUID: "GPU-a"}
	tests := []struct {
		name string
		h    *health.Health
		want string
	}{
		{"nothing watches", nil, "NVML answers for this GPU"},
		{"watched", &health.Health{Healthy: true, Monitored: true, Reason: health.ReasonWatched, Message: "NVML events watched: Xid"},
			"NVML answers for this GPU; NVML events watched: Xid"},
		{"not monitored", &health.Health{Healthy: true, Reason: health.ReasonNotMonitored, Message: "health not monitored: the GPU reports no Xid events"},
			"NVML answers for this GPU; health not monitored: the GPU reports no Xid events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := gpuStatus(dev, observed{health: tt.h}, nil, nil, nil)
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHealthy)
			if c == nil || c.Status != metav1.ConditionTrue || c.Message != tt.want {
				t.Errorf("Healthy = %+v, want True with %q", c, tt.want)
			}
		})
	}
}

// A GPU drained away from MPS still runs its daemon with the replicas of before: its status keeps them, so
// the shares its pods hold stay counted (found on the H100: the status said MPS with 0 replicas while
// draining, and the device plugin advertised none of the held shares).
func TestMPSReplicasStayInTheStatusWhileTheGPUIsDrainedAwayFromMPS(t *testing.T) {
	dev := gpu.Device{Index: 0, UUID: "GPU-a"}
	obs := observed{mps: &mps.Status{State: mps.StateRunning, PID: 42, Settings: mps.Settings{ActiveThreadPercentage: 50}}}
	mpsDesired := &v1alpha1.GPUDesired{UUID: "GPU-a", Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 2}}}
	prev := gpuStatus(dev, obs, mpsDesired, nil, nil)
	if prev.Applied.MPS == nil || prev.Applied.MPS.Replicas != 2 {
		t.Fatalf("applied MPS %+v, want 2 replicas", prev.Applied.MPS)
	}
	exclusive := &v1alpha1.GPUDesired{UUID: "GPU-a", Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyExclusive}}
	st := gpuStatus(dev, obs, exclusive, errors.New("draining"), &prev)
	if st.Applied.MPS == nil || st.Applied.MPS.Replicas != 2 {
		t.Errorf("while draining to Exclusive: applied MPS %+v, want the 2 replicas in force", st.Applied.MPS)
	}
}

func sizedMPS(step string) v1alpha1.Sharing {
	q := resource.MustParse(step)
	return v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 4},
		Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: &q}}
}

// The sizing in force decides what DRA publishes and whether the device plugin advertises the GPU, so it
// follows the GPU, not the spec: the desired sizing once applied, the previous one while a change drains.
func TestSizingInForceFollowsTheGPUThroughADrain(t *testing.T) {
	dev := gpu.Device{Index: 0, UUID: "GPU-a", MemoryBytes: 40 << 30}
	obs := observed{mps: &mps.Status{State: mps.StateRunning, PID: 42}}
	fixed := &v1alpha1.GPUDesired{UUID: "GPU-a", Sharing: v1alpha1.Sharing{Strategy: v1alpha1.StrategyMPS, MPS: &v1alpha1.MPSSharing{Replicas: 4}}}
	sized := &v1alpha1.GPUDesired{UUID: "GPU-a", Sharing: sizedMPS("1Gi")}
	devicePlugin := func(st v1alpha1.GPUStatus) string {
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDevicePlugin)
		if c == nil {
			return "absent"
		}
		return string(c.Status) + "/" + c.Reason
	}

	st := gpuStatus(dev, obs, fixed, nil, nil)
	if st.Applied.Sizing != nil || devicePlugin(st) != "absent" {
		t.Fatalf("fixed shares: sizing %+v, DevicePlugin %s; want none, absent", st.Applied.Sizing, devicePlugin(st))
	}
	st = gpuStatus(dev, obs, sized, errors.New("draining"), &st)
	if st.Applied.Sizing != nil || devicePlugin(st) != "absent" {
		t.Fatalf("while draining to sized shares: sizing %+v, DevicePlugin %s; want the fixed shares in force", st.Applied.Sizing, devicePlugin(st))
	}
	st = gpuStatus(dev, obs, sized, nil, &st)
	if !st.Applied.Sizing.PerClaim() || devicePlugin(st) != "False/"+v1alpha1.ReasonSizedByClaim {
		t.Fatalf("sized shares applied: sizing %+v, DevicePlugin %s; want PerClaim, False/SizedByClaim", st.Applied.Sizing, devicePlugin(st))
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionApplied); c == nil || c.Message != "MPS x4 sized per claim is in force" {
		t.Errorf("Applied condition %+v: want the message to name the sizing", c)
	}
	st = gpuStatus(dev, obs, fixed, errors.New("draining"), &st)
	if !st.Applied.Sizing.PerClaim() || devicePlugin(st) != "False/"+v1alpha1.ReasonSizedByClaim {
		t.Fatalf("while draining back to fixed shares: sizing %+v, DevicePlugin %s; want the sized shares in force", st.Applied.Sizing, devicePlugin(st))
	}
	st = gpuStatus(dev, obs, fixed, nil, &st)
	if st.Applied.Sizing != nil || devicePlugin(st) != "absent" {
		t.Errorf("fixed shares applied again: sizing %+v, DevicePlugin %s; want none, absent", st.Applied.Sizing, devicePlugin(st))
	}
}
