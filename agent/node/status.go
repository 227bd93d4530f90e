package node

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/health"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// observed is what is in force on one GPU besides the NVML snapshot: the MPS daemon, time-slicing and
// the shim's scheduler.
type observed struct {
	mps       *mps.Status
	timeslice *timeslice.Setting
	shim      *ShimState
	// health is what the NVML event watcher saw; nil when nothing watches (a GPU counts as healthy).
	health *health.Health
	// instances are the claims' MIG instances the watcher marked alone, by GPU instance id.
	instances map[int]health.Health
}

// gpuStatus builds one GPU's status from what was observed after the pass. desired is nil for a GPU no
// policy lists; err is what kept the GPU from its desired sharing.
func gpuStatus(dev gpu.Device, obs observed, desired *v1alpha1.GPUDesired, err error, prev *v1alpha1.GPUStatus) v1alpha1.GPUStatus {
	st := v1alpha1.GPUStatus{
		UUID:        dev.UUID,
		Index:       int32(dev.Index),
		Product:     dev.Product,
		Memory:      resource.NewQuantity(int64(dev.MemoryBytes), resource.BinarySI),
		MIGCapable:  dev.MIGCapable,
		ComputeMode: string(dev.ComputeMode),
		MIGProfiles: MIGProfiles(dev.Profiles),
		Applied:     applied(dev, obs),
	}
	if dev.Minor >= 0 {
		minor := int32(dev.Minor)
		st.MinorNumber = &minor
	}
	if dev.MIGCapable {
		st.MIGMode = &v1alpha1.MIGModeStatus{Current: enabled(dev.MIGMode.Current), Pending: enabled(dev.MIGMode.Pending)}
	}
	if prev != nil {
		st.Conditions = append([]metav1.Condition(nil), prev.Conditions...)
	}
	setGPUApplied(&st, dev, desired, err)
	keepInForce(&st, desired, err, prev)
	appliedMIGDynamic(&st, desired, err, prev)
	if st.Applied.Sizing.PerClaim() {
		setCondition(&st.Conditions, v1alpha1.ConditionDevicePlugin, metav1.ConditionFalse, v1alpha1.ReasonSizedByClaim,
			"shares are sized per claim, which only DRA carries: claim them with the DeviceClass gpusharing-sized")
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionDevicePlugin)
	}
	if desired != nil {
		st.Applied.Policy = desired.Policy
		st.Applied.PolicyGeneration = desired.PolicyGeneration
	}
	setGPUHealthy(&st, obs)
	return st
}

// setGPUApplied sets the GPU's Applied condition, and what is in force where the desired sharing is.
func setGPUApplied(st *v1alpha1.GPUStatus, dev gpu.Device, desired *v1alpha1.GPUDesired, err error) {
	switch {
	case desired == nil:
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonNotDesired, "no policy lists this GPU; it is left as found")
	case err != nil:
		reason, msg := reasonFor(err)
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionFalse, reason, msg)
		if reason == v1alpha1.ReasonGPUBusy {
			st.Processes = dev.PIDs()
		}
	default:
		st.Applied.Strategy = desired.Sharing.Strategy
		st.Applied.SpecHash = v1alpha1.SharingHash(desired.Sharing)
		setCondition(&st.Conditions, v1alpha1.ConditionApplied, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, describeDesired(desired.Sharing)+" is in force")
	}
}

// keepInForce sets what the agent, not the hardware, holds in force: the MPS replicas, the sizing and
// the production classes, the desired ones once applied and, while a change drains the GPU, the ones
// before.
func keepInForce(st *v1alpha1.GPUStatus, desired *v1alpha1.GPUDesired, err error, prev *v1alpha1.GPUStatus) {
	if st.Applied.MPS != nil {
		// Replicas are the device plugin's shares of the daemon, not a daemon setting: the desired count, or,
		// while the GPU is being changed away from MPS (drained), the count in force before. Without it the
		// shares the drained pods still hold would vanish from the status and from the node's allocatable.
		switch {
		case desired != nil && desired.Sharing.MPS != nil:
			st.Applied.MPS.Replicas = desired.Sharing.MPS.Replicas
		case prev != nil && prev.Applied != nil && prev.Applied.MPS != nil:
			st.Applied.MPS.Replicas = prev.Applied.MPS.Replicas
		}
	}
	// The claims allocated on a draining GPU keep their sized device (and the device plugin keeps its
	// shares away) until the GPU is empty. Production classes take effect with the sharing that carries
	// them (the shim's scheduler, the MPS clients' env), so they are in force exactly when it is.
	switch {
	case desired != nil && err == nil:
		if desired.Sharing.Sizing.PerClaim() {
			st.Applied.Sizing = desired.Sharing.Sizing.DeepCopy()
		}
		st.Applied.QoS = desired.Sharing.QoS.DeepCopy()
		st.Applied.UnmanagedProcesses = desired.Sharing.UnmanagedProcesses
	case desired != nil && prev != nil && prev.Applied != nil && prev.Applied.Strategy == st.Applied.Strategy:
		st.Applied.Sizing = prev.Applied.Sizing.DeepCopy()
		st.Applied.QoS = prev.Applied.QoS.DeepCopy()
		st.Applied.UnmanagedProcesses = prev.Applied.UnmanagedProcesses
	}
}

// setGPUHealthy sets the GPU's Healthy condition from the NVML event watcher and the MPS daemon.
func setGPUHealthy(st *v1alpha1.GPUStatus, obs observed) {
	switch {
	case obs.health != nil && !obs.health.Healthy:
		// A critical Xid outranks a daemon problem: the device plugin stops advertising the GPU either way.
		setCondition(&st.Conditions, v1alpha1.ConditionHealthy, metav1.ConditionFalse, obs.health.Reason, obs.health.Message)
	case obs.mps != nil && (obs.mps.State == mps.StateFailed || obs.mps.State == mps.StateRestarting):
		setCondition(&st.Conditions, v1alpha1.ConditionHealthy, metav1.ConditionFalse, v1alpha1.ReasonMPSDaemonFailed,
			fmt.Sprintf("MPS daemon %s after %d restarts: %s", strings.ToLower(string(obs.mps.State)), obs.mps.Restarts, obs.mps.LastError))
	default:
		// The watcher's word says whether Xids are watched at all, so "Healthy" is never claimed unchecked.
		msg := "NVML answers for this GPU"
		if obs.health != nil && obs.health.Message != "" {
			msg += "; " + obs.health.Message
		}
		setCondition(&st.Conditions, v1alpha1.ConditionHealthy, metav1.ConditionTrue, v1alpha1.ReasonAsDesired, msg)
	}
}

// applied describes what is in force, whatever was desired: MIG instances when MIG mode is on, the MPS
// daemon the agent runs, recorded time-slicing, otherwise the whole GPU (Exclusive).
func applied(dev gpu.Device, obs observed) *v1alpha1.AppliedSharing {
	a := &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive}
	switch {
	case dev.MIGMode.Current:
		a.Strategy = v1alpha1.StrategyMIG
		for _, in := range dev.Instances {
			a.MIGInstances = append(a.MIGInstances, v1alpha1.MIGInstanceStatus{
				Profile:           in.Profile,
				Placement:         v1alpha1.MIGPlacement{Start: int32(in.Placement.Start), Size: int32(in.Placement.Size)},
				UUID:              in.UUID,
				GPUInstanceID:     int32(in.GIID),
				ComputeInstanceID: int32(in.CIID),
				Unhealthy:         obs.instances[in.GIID].Message,
			})
		}
	case obs.mps != nil:
		a.Strategy = v1alpha1.StrategyMPS
		a.MPS = &v1alpha1.MPSStatus{
			State:                  obs.mps.State,
			PID:                    int32(obs.mps.PID),
			Clients:                int32(obs.mps.Clients),
			Restarts:               int32(obs.mps.Restarts),
			ActiveThreadPercentage: obs.mps.Settings.ActiveThreadPercentage,
			PinnedMemoryLimit:      quantityMiB(obs.mps.Settings.PinnedMemoryLimitMiB),
		}
	case obs.timeslice != nil:
		a.Strategy = v1alpha1.StrategyTimeSlicing
		a.TimeSlicing = &v1alpha1.TimeSlicingSharing{Replicas: obs.timeslice.Replicas, Interval: obs.timeslice.Interval}
	}
	if obs.shim != nil {
		// The scheduler runs beside time-slicing or the whole GPU (Exclusive).
		a.Shim = shimStatus(*obs.shim)
	}
	return a
}

// MIGProfiles is the status of the MIG profiles NVML offers, as the agent publishes it.
func MIGProfiles(ps []gpu.Profile) []v1alpha1.MIGProfile {
	var out []v1alpha1.MIGProfile
	for _, p := range ps {
		mp := v1alpha1.MIGProfile{
			Name:         p.Name,
			ID:           int32(p.ID),
			SliceCount:   int32(p.SliceCount),
			Memory:       resource.NewQuantity(int64(p.MemoryMB)<<20, resource.BinarySI),
			MaxInstances: int32(p.MaxInstances),
		}
		for _, pl := range p.Placements {
			mp.Placements = append(mp.Placements, v1alpha1.MIGPlacement{Start: int32(pl.Start), Size: int32(pl.Size)})
		}
		out = append(out, mp)
	}
	return out
}

func enabled(b bool) string {
	if b {
		return "Enabled"
	}
	return "Disabled"
}

// setCondition sets a condition, keeping its transition time when only the message changes.
func setCondition(conds *[]metav1.Condition, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg})
}

// describeDesired renders a sharing for messages: "MIG 3g.40gb x1 + 1g.10gb x4", "MPS x4", "MPS x4
// sized per claim" (the drain's target says the contract a drain makes room for).
func describeDesired(s v1alpha1.Sharing) string {
	if s.Sizing.PerClaim() {
		sized := s
		sized.Sizing = nil
		return describeDesired(sized) + " sized per claim"
	}
	switch {
	case s.MIG != nil:
		var parts []string
		for _, in := range s.MIG.Instances {
			parts = append(parts, fmt.Sprintf("%s x%d", in.Profile, in.Count))
		}
		if s.MIG.Dynamic != nil {
			parts = append(parts, "from claims "+strings.Join(s.MIG.Dynamic.Profiles, ","))
		}
		return "MIG " + strings.Join(parts, " + ")
	case s.MPS != nil:
		return fmt.Sprintf("MPS x%d", s.MPS.Replicas)
	case s.TimeSlicing != nil:
		return fmt.Sprintf("TimeSlicing x%d (%s)", s.TimeSlicing.Replicas, s.TimeSlicing.Interval)
	}
	return string(s.Strategy)
}

// token renders one GPU for the node summary: what is in force, and why not the desired, if so.
func token(st v1alpha1.GPUStatus) string {
	a := st.Applied
	var s string
	switch {
	case a == nil:
		s = "Unknown"
	case a.Strategy == v1alpha1.StrategyMIG && a.MIGDynamic != nil:
		s = dynamicToken(a)
	case a.Strategy == v1alpha1.StrategyMIG:
		var ins []gpu.Instance
		for _, in := range a.MIGInstances {
			ins = append(ins, gpu.Instance{Profile: in.Profile})
		}
		s = "MIG(" + mig.Summary(ins) + ")"
	case a.Strategy == v1alpha1.StrategyMPS && a.MPS != nil:
		s = fmt.Sprintf("MPS×%d", max(a.MPS.Replicas, 1))
	case a.Strategy == v1alpha1.StrategyTimeSlicing && a.TimeSlicing != nil:
		s = fmt.Sprintf("TimeSlicing×%d", a.TimeSlicing.Replicas)
	default:
		s = string(a.Strategy)
	}
	if a != nil && a.Shim != nil {
		// The shim's scheduler runs: pods share the GPU's memory by swapping (oversubscription), which
		// changes what a pod can count on, so the one-line summary must say it.
		s += "+Oversub"
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionApplied); c != nil && c.Status != metav1.ConditionTrue {
		s += "!" + c.Reason
	}
	return s
}

// Summary renders the node's GPUs in index order with runs of equal GPUs folded:
// "0:MIG(3g.40gb,1g.10gb×4) 1:MPS×4 2-7:Exclusive", with "+Oversub" after a GPU whose shim scheduler
// runs ("0:TimeSlicing×4+Oversub").
func Summary(gpus []v1alpha1.GPUStatus) string {
	sorted := append([]v1alpha1.GPUStatus(nil), gpus...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var parts []string
	for i := 0; i < len(sorted); {
		j := i
		t := token(sorted[i])
		for j+1 < len(sorted) && sorted[j+1].Index == sorted[j].Index+1 && token(sorted[j+1]) == t {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprintf("%d:%s", sorted[i].Index, t))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d:%s", sorted[i].Index, sorted[j].Index, t))
		}
		i = j + 1
	}
	return strings.Join(parts, " ")
}

func quantityMiB(mib int64) *resource.Quantity {
	if mib <= 0 {
		return nil
	}
	return resource.NewQuantity(mib<<20, resource.BinarySI)
}
