package share

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/share/sharetest"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// brief renders a device map as "resource: id(kind,health) ..." lines, sorted, for comparison.
func brief(m map[ResourceName][]Device) []string {
	var out []string
	for res, devs := range m {
		var ids []string
		for _, d := range devs {
			ids = append(ids, d.String())
		}
		out = append(out, string(res)+": "+strings.Join(ids, " "))
	}
	sort.Strings(out)
	return out
}

func TestDevicesFromStatus(t *testing.T) {
	cases := []struct {
		name   string
		status v1alpha1.GPUNodeStatus
		want   []string
	}{
		{
			name:   "a GPU with nothing applied is an exclusive nvidia.com/gpu",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a")),
			want:   []string{"nvidia.com/gpu: GPU-a(Exclusive,Healthy)"},
		},
		{
			name:   "an Exclusive GPU is advertised whole",
			status: sharetest.NodeStatus(sharetest.GPU(1, "GPU-b", sharetest.Exclusive()), sharetest.GPU(0, "GPU-a", sharetest.Exclusive())),
			want:   []string{"nvidia.com/gpu: GPU-a(Exclusive,Healthy) GPU-b(Exclusive,Healthy)"},
		},
		{
			name:   "time-slicing advertises one replica per slot under its own resource",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(3))),
			want:   []string{"gpusharing.io/gpu-timeslice: GPU-a::0(TimeSlicing,Healthy) GPU-a::1(TimeSlicing,Healthy) GPU-a::2(TimeSlicing,Healthy)"},
		},
		{
			name:   "MPS advertises its replicas",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(2, 50, "8Gi", "Running"))),
			want:   []string{"gpusharing.io/gpu-mps: GPU-a::0(MPS,Healthy) GPU-a::1(MPS,Healthy)"},
		},
		{
			name:   "MPS replicas are unhealthy while the daemon is not running",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(2, 0, "", "Restarting"))),
			want:   []string{"gpusharing.io/gpu-mps: GPU-a::0(MPS,Unhealthy) GPU-a::1(MPS,Unhealthy)"},
		},
		{
			name:   "MIG instances go under one resource per profile; one without a uuid is skipped",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MIGInstance("1g.10gb", "MIG-2"), sharetest.MIGInstance("3g.40gb", "MIG-3"), sharetest.MIGInstance("1g.10gb", "MIG-1"), sharetest.MIGInstance("1g.10gb", ""))),
			want: []string{
				"nvidia.com/mig-1g.10gb: MIG-1(MIG,Healthy) MIG-2(MIG,Healthy)",
				"nvidia.com/mig-3g.40gb: MIG-3(MIG,Healthy)",
			},
		},
		{
			name:   "a '+' in a MIG profile becomes '.' in the resource name",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MIGInstance("1g.10gb+me", "MIG-1"))),
			want:   []string{"nvidia.com/mig-1g.10gb.me: MIG-1(MIG,Healthy)"},
		},
		{
			name:   "a GPU in MIG mode with no instances applied is not advertised whole",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MIGModeOn())),
			want:   nil,
		},
		{
			name:   "the shim on an Exclusive GPU advertises ShimReplicas shared replicas and no nvidia.com/gpu",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.Shim(time.Second))),
			want:   []string{"gpusharing.io/gpu-shared: GPU-a::0(Shared,Healthy) GPU-a::1(Shared,Healthy) GPU-a::2(Shared,Healthy) GPU-a::3(Shared,Healthy)"},
		},
		{
			name:   "the shim on a time-sliced GPU uses its time-slice replicas under the shared resource",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2), sharetest.Shim(time.Second))),
			want:   []string{"gpusharing.io/gpu-shared: GPU-a::0(Shared,Healthy) GPU-a::1(Shared,Healthy)"},
		},
		{
			name:   "Healthy=False marks every device of the GPU unhealthy",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.TimeSliced(2), sharetest.Health(metav1.ConditionFalse)), sharetest.GPU(1, "GPU-b", sharetest.Health(metav1.ConditionTrue))),
			want: []string{
				"gpusharing.io/gpu-timeslice: GPU-a::0(TimeSlicing,Unhealthy) GPU-a::1(TimeSlicing,Unhealthy)",
				"nvidia.com/gpu: GPU-b(Exclusive,Healthy)",
			},
		},
		{
			name: "a GPU sized per claim is DRA's alone, MPS or shim; the other GPUs are advertised as before",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", sharetest.MPS(4, 0, "", "Running"), sharetest.SizedPerClaim()), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2), sharetest.Shim(time.Second), sharetest.SizedPerClaim()),
				sharetest.GPU(2, "GPU-c", sharetest.MPS(2, 0, "", "Running"))),
			want: []string{"gpusharing.io/gpu-mps: GPU-c::0(MPS,Healthy) GPU-c::1(MPS,Healthy)"},
		},
		{
			name:   "MPS without a reported daemon advertises nothing",
			status: sharetest.NodeStatus(sharetest.GPU(0, "GPU-a", func(g *v1alpha1.GPUStatus) { sharetest.Applied(g).Strategy = v1alpha1.StrategyMPS })),
			want:   nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := brief(DevicesFromStatus(tc.status, Config{}))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

func TestDevicesFromStatusHonoursConfiguredNames(t *testing.T) {
	cfg := Config{Resources: ResourceNames{Exclusive: "example.com/whole", TimeSlicing: "example.com/slice", MIGPrefix: "example.com/mig-"}}
	got := brief(DevicesFromStatus(sharetest.NodeStatus(sharetest.GPU(0, "GPU-a"), sharetest.GPU(1, "GPU-b", sharetest.TimeSliced(2)), sharetest.GPU(2, "GPU-c", sharetest.MIGInstance("2g.20gb", "MIG-1"))), cfg))
	want := []string{
		"example.com/mig-2g.20gb: MIG-1(MIG,Healthy)",
		"example.com/slice: GPU-b::0(TimeSlicing,Healthy) GPU-b::1(TimeSlicing,Healthy)",
		"example.com/whole: GPU-a(Exclusive,Healthy)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestDevicesFromStatusCarriesModeSettings(t *testing.T) {
	m := DevicesFromStatus(sharetest.NodeStatus(
		sharetest.GPU(0, "GPU-a", sharetest.MPS(4, 0, "18Gi", "Running")),
		sharetest.GPU(1, "GPU-b", sharetest.Shim(1500*time.Millisecond)),
		sharetest.GPU(3, "GPU-d", sharetest.TimeSliced(2), sharetest.ShimBudget(time.Second, "8Gi")),
		sharetest.GPU(2, "GPU-c", sharetest.MIGInstance("1g.10gb", "MIG-1")),
	), Config{})
	if got, want := *m["gpusharing.io/gpu-mps"][0].MPS, (MPSLimits{ActiveThreadPercentage: 25, PinnedMemoryLimitMiB: 18 * 1024}); got != want {
		t.Errorf("MPS limits: got %+v, want %+v (omitted activeThreadPercentage is 100/replicas)", got, want)
	}
	for _, d := range m["gpusharing.io/gpu-shared"] {
		if want := d.GPUUUID == "GPU-d"; d.ShimOversub != want {
			t.Errorf("shim device %s: oversubscription %v, want %v (only a scheduler with a memory budget swaps)", d.ID, d.ShimOversub, want)
		}
	}
	mig := m["nvidia.com/mig-1g.10gb"][0]
	if mig.GPUUUID != "GPU-c" || mig.VisibleUUID != "MIG-1" {
		t.Errorf("MIG device: got parent %q visible %q, want GPU-c and MIG-1", mig.GPUUUID, mig.VisibleUUID)
	}
}

func TestGPUOfDeviceID(t *testing.T) {
	for id, want := range map[string]string{"GPU-a::3": "GPU-a", "GPU-a": "GPU-a", "MIG-1": "MIG-1", ReplicaID("GPU-b", 12): "GPU-b"} {
		if got := GPUOfDeviceID(id); got != want {
			t.Errorf("GPUOfDeviceID(%q) = %q, want %q", id, got, want)
		}
	}
}

func TestConfigLayoutAgreesWithMounts(t *testing.T) {
	cfg := Config{MPSRoot: "/r/mps", SchedulerRoot: "/r/sched"}.WithDefaults()
	if got := cfg.MPSPipeDir("GPU-a"); got != "/r/mps/GPU-a/pipe" {
		t.Errorf("MPSPipeDir = %q", got)
	}
	if got := cfg.MPSLogDir("GPU-a"); got != "/r/mps/GPU-a/log" {
		t.Errorf("MPSLogDir = %q", got)
	}
	if got := cfg.SchedulerSocketPath("GPU-a"); got != "/r/sched/GPU-a/gpushare.sock" {
		t.Errorf("SchedulerSocketPath = %q", got)
	}
	if got := DefaultConfig().KubeletSocket(); got != "/var/lib/kubelet/device-plugins/kubelet.sock" {
		t.Errorf("default kubelet socket = %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		res   ResourceNames
		valid bool
	}{
		{"the defaults", ResourceNames{}, true},
		{"custom names", ResourceNames{Exclusive: "example.com/gpu", TimeSlicing: "example.com/gpu-ts", MIGPrefix: "example.com/mig-"}, true},
		{"two kinds under one name", ResourceNames{TimeSlicing: "gpusharing.io/gpu-mps"}, false},
		{"a name without a domain", ResourceNames{Shared: "gpu-shared"}, false},
		{"a reserved domain", ResourceNames{Exclusive: "kubernetes.io/gpu"}, false},
		{"a name that is not a qualified name", ResourceNames{MPS: "gpusharing.io/gpu mps"}, false},
		{"a name under the MIG prefix", ResourceNames{Exclusive: "nvidia.com/mig-whole"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Config{Resources: tc.res}.Validate()
			if tc.valid && err != nil {
				t.Errorf("got %v, want valid", err)
			}
			if !tc.valid && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("got %v, want ErrInvalidConfig", err)
			}
		})
	}
}
