package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Strategy is how one physical GPU is shared.
// +kubebuilder:validation:Enum=Exclusive;TimeSlicing;MPS;MIG
type Strategy string

const (
	// StrategyExclusive gives the whole GPU to one pod at a time.
	StrategyExclusive Strategy = "Exclusive"
	// StrategyTimeSlicing lets several pods share the GPU through the driver's time-slice scheduler.
	StrategyTimeSlicing Strategy = "TimeSlicing"
	// StrategyMPS runs one MPS control daemon for the GPU and lets pods share it as MPS clients.
	StrategyMPS Strategy = "MPS"
	// StrategyMIG partitions the GPU into MIG instances.
	StrategyMIG Strategy = "MIG"
)

// Sharing is the discriminated union that says how a GPU is shared: strategy picks exactly one of the
// strategy blocks, and oversubscription may be added to the strategies where the shim runs.
// +kubebuilder:validation:XValidation:rule="has(self.mps) == (self.strategy == 'MPS')",message="sharing.mps: set it exactly when sharing.strategy is MPS"
// +kubebuilder:validation:XValidation:rule="has(self.timeSlicing) == (self.strategy == 'TimeSlicing')",message="sharing.timeSlicing: set it exactly when sharing.strategy is TimeSlicing"
// +kubebuilder:validation:XValidation:rule="has(self.mig) == (self.strategy == 'MIG')",message="sharing.mig: set it exactly when sharing.strategy is MIG"
// +kubebuilder:validation:XValidation:rule="!has(self.oversubscription) || self.strategy in ['TimeSlicing', 'Exclusive']",message="sharing.oversubscription: allowed only with strategy TimeSlicing or Exclusive (MPS and MIG clients cannot be swapped by the shim)"
// +kubebuilder:validation:XValidation:rule="!has(self.sizing) || self.sizing.mode != 'PerClaim' || self.strategy != 'MIG'",message="sharing.sizing: mode PerClaim is not possible with MIG (an instance's size is its profile's)"
// +kubebuilder:validation:XValidation:rule="!has(self.sizing) || self.sizing.mode != 'PerClaim' || self.strategy in ['MPS', 'MIG'] || has(self.oversubscription)",message="sharing.sizing: mode PerClaim needs something that enforces each claim's size: strategy MPS, or oversubscription (the shim's memory limit) with TimeSlicing or Exclusive"
// +kubebuilder:validation:XValidation:rule="!has(self.sizing) || self.sizing.mode != 'PerClaim' || !has(self.mps) || (!has(self.mps.activeThreadPercentage) && !has(self.mps.pinnedMemoryLimit))",message="sharing.mps: leave activeThreadPercentage and pinnedMemoryLimit unset with sizing PerClaim (each claim sets its own, and an MPS client can only lower the daemon's defaults)"
// +kubebuilder:validation:XValidation:rule="!has(self.qos) || self.strategy == 'MPS' || has(self.oversubscription)",message="sharing.qos: needs something that can favour production: strategy MPS (client priority), or oversubscription (the shim's lock) with TimeSlicing or Exclusive; plain time-slicing gives every process equal turns and cannot"
// +kubebuilder:validation:XValidation:rule="!has(self.qos) || !has(self.qos.opportunisticThreadPercentage) || self.strategy == 'MPS'",message="sharing.qos.opportunisticThreadPercentage: applies only to strategy MPS"
// +kubebuilder:validation:XValidation:rule="!has(self.qos) || !has(self.qos.opportunisticQueue) || has(self.oversubscription)",message="sharing.qos.opportunisticQueue: applies only with oversubscription (the shim paces its launches)"
// +kubebuilder:validation:XValidation:rule="!has(self.qos) || !has(self.qos.opportunisticQueueTime) || has(self.oversubscription)",message="sharing.qos.opportunisticQueueTime: applies only with oversubscription (the shim paces its launches)"
// +kubebuilder:validation:XValidation:rule="!has(self.qos) || !has(self.qos.settleFloor) || has(self.oversubscription)",message="sharing.qos.settleFloor: applies only with oversubscription (the shim releases the lock)"
// +kubebuilder:validation:XValidation:rule="!has(self.unmanagedProcesses) || has(self.oversubscription) || (self.strategy == 'MPS' && has(self.sizing) && self.sizing.mode == 'PerClaim')",message="sharing.unmanagedProcesses: applies only with oversubscription (clients of the shim's scheduler) or with strategy MPS and sizing PerClaim (clients of the MPS server); elsewhere nothing tells a managed process from another"
type Sharing struct {
	// strategy is how the GPU is shared: Exclusive, TimeSlicing, MPS or MIG.
	// +required
	Strategy Strategy `json:"strategy"`

	// mps configures MPS sharing; set it exactly when strategy is MPS.
	// +optional
	MPS *MPSSharing `json:"mps,omitempty"`

	// timeSlicing configures time-sliced sharing; set it exactly when strategy is TimeSlicing.
	// +optional
	TimeSlicing *TimeSlicingSharing `json:"timeSlicing,omitempty"`

	// mig configures the MIG layout; set it exactly when strategy is MIG.
	// +optional
	MIG *MIGSharing `json:"mig,omitempty"`

	// oversubscription turns on the in-pod shim: a cooperative GPU lock with a time quantum and memory
	// oversubscription by explicit swapping. Only with TimeSlicing or Exclusive.
	// +optional
	Oversubscription *Oversubscription `json:"oversubscription,omitempty"`

	// sizing says who sizes the GPU's shares: the policy (Fixed, the default: replicas of equal size) or
	// each workload's ResourceClaim (PerClaim: one DRA device with consumable memory and compute). Only
	// with MPS, or with oversubscription on TimeSlicing or Exclusive, where something enforces a size.
	// Changing it is disruptive: the GPU is drained first.
	// +optional
	Sizing *Sizing `json:"sizing,omitempty"`

	// qos splits the GPU's pods into production and opportunistic by their priority: production runs as
	// if alone as far as the strategy allows, opportunistic work takes what production leaves. Only with
	// MPS or with oversubscription. Changing it is not disruptive.
	// +optional
	QoS *QoS `json:"qos,omitempty"`

	// unmanagedProcesses is what the agent does about a pod's process that holds a context on the GPU
	// without being managed there: not a client of the shim's scheduler (oversubscription), or not a
	// client of the MPS server (MPS sized per claim). Report (omitted) names it in the GPU's status, by
	// a condition and an event on its pod; Evict also evicts its pod. Processes outside pods (the MPS
	// server, nvidia-smi, DCGM) are counted, never named. Only with oversubscription, or MPS with sizing
	// PerClaim. Changing it is not disruptive.
	// +optional
	UnmanagedProcesses UnmanagedAction `json:"unmanagedProcesses,omitempty"`
}

// UnmanagedAction is what the agent does about a pod's process on a GPU that is not managed there.
// +kubebuilder:validation:Enum=Report;Evict
type UnmanagedAction string

const (
	// UnmanagedReport: the GPU's Managed condition turns False and its status names the process, with a
	// warning event on the pod.
	UnmanagedReport UnmanagedAction = "Report"
	// UnmanagedEvict: reported, and the pod is evicted through the Eviction API (its
	// PodDisruptionBudget applies).
	UnmanagedEvict UnmanagedAction = "Evict"
)

// QoS is how a GPU favours production pods over opportunistic ones.
type QoS struct {
	// productionPriority: a pod whose priority (its PriorityClass's value, as the API server resolved it
	// at admission) is at least this is production; every other pod on the GPU is opportunistic. What a
	// pod's own processes say (GPUSHARE_PRIORITY, CUDA_MPS_CLIENT_PRIORITY) never makes it production.
	// 1000 to 1000000000: a pod without a PriorityClass has priority 0 and clusters commonly give their
	// default and batch classes small values, so a lower threshold would make every tenant's ordinary pods
	// production; 1000000000 is the highest value a user-defined PriorityClass may have. The threshold
	// alone does not stop a tenant naming a production class (system-cluster-critical and
	// system-node-critical, 2000000000 and up, are above every threshold): the admin's ResourceQuota
	// recipe does (config/qos-quota, docs/deploy.md).
	// +kubebuilder:validation:XValidation:rule="self >= 1000 && self <= 1000000000",message="qos.productionPriority: must be from 1000 to 1000000000; pods without a PriorityClass have priority 0 and default classes are small, so a lower threshold makes ordinary pods production (see docs/deploy.md for limiting who may use production classes)"
	// +required
	ProductionPriority int32 `json:"productionPriority"`

	// opportunisticQueue (oversubscription only) is how many kernel and graph launches an opportunistic
	// process may have queued on the GPU while a production process is busy (waits for or holds the GPU,
	// or did within the last 10 seconds), a launch that runs under 100 microseconds counting as its
	// fraction of one, so that production, which takes the lock from it at once, shares the GPU only with
	// that much of its work: fewer keep production's latency closer to its own, more give the
	// opportunistic work more of the GPU (docs/qos.md measures both). 1-1024; omitted: 3.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	OpportunisticQueue *int32 `json:"opportunisticQueue,omitempty"`

	// opportunisticQueueTime (oversubscription only) bounds the same queue in GPU time: an opportunistic
	// process keeps at most this much of its work's estimated run time queued while a production process
	// is busy (the shim times each kind of launch), so production's wait at a new request is at most this
	// plus the opportunistic kernel running then. It replaces opportunisticQueue for shims that measure GPU
	// time (protocol 7); "0s" keeps the bound in launches (opportunisticQueue) for all. 0s-100ms; omitted:
	// 500us (docs/qos.md).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('100ms')",message="qos.opportunisticQueueTime: must be from 0s (the bound in launches alone) to 100ms"
	// +optional
	OpportunisticQueueTime *metav1.Duration `json:"opportunisticQueueTime,omitempty"`

	// settleFloor (oversubscription only): while an opportunistic process is busy, a production process
	// releases the lock once the GPU work it submitted has completed and this long passed without a GPU
	// call from it, so the opportunistic work runs in production's gaps from their start; its next launch
	// takes the lock back at once. "0s" turns the release on completion off: production keeps the GPU for
	// the scheduler's 1 ms idle window after its last call instead. 0s-1ms; omitted: 100us (docs/qos.md).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1ms')",message="qos.settleFloor: must be from 0s (no release on completion: the idle window alone) to 1ms"
	// +optional
	SettleFloor *metav1.Duration `json:"settleFloor,omitempty"`

	// opportunisticThreadPercentage (MPS only) caps the share of the GPU's SMs an opportunistic client
	// may use, 1-100, on top of its share's own cap. Opportunistic clients also run at MPS client
	// priority "below normal". Omitted: no extra cap.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	OpportunisticThreadPercentage *int32 `json:"opportunisticThreadPercentage,omitempty"`
}

// Production says whether a pod of priority p is production under q; nil q has no production class.
func (q *QoS) Production(p int32) bool { return q != nil && p >= q.ProductionPriority }

// SizingMode says who sizes a shared GPU's shares.
// +kubebuilder:validation:Enum=Fixed;PerClaim
type SizingMode string

const (
	// SizingFixed: the policy cuts the GPU into replicas of equal size (device plugin and DRA).
	SizingFixed SizingMode = "Fixed"
	// SizingPerClaim: each DRA claim asks for its memory and compute; the GPU is one device with
	// consumable capacity, offered through DRA only.
	SizingPerClaim SizingMode = "PerClaim"
)

// ExceedAction is what the agent does about a pod holding more of a sized GPU's memory than its claims.
// +kubebuilder:validation:Enum=Report;Evict
type ExceedAction string

const (
	// ExceedReport: the GPU's WithinClaims condition turns False naming the pod, with a warning event on
	// the pod and on the GPUNode.
	ExceedReport ExceedAction = "Report"
	// ExceedEvict: reported, and the pod is evicted through the Eviction API (its PodDisruptionBudget
	// applies).
	ExceedEvict ExceedAction = "Evict"
)

// DefaultMemoryStep is the memory granularity of sized shares when the policy sets none.
const DefaultMemoryStep = "1Gi"

// Sizing is how the shares of a GPU are sized.
// +kubebuilder:validation:XValidation:rule="self.mode == 'PerClaim' || (!has(self.memoryStep) && !has(self.minMemory) && !has(self.onExceed))",message="sizing: memoryStep, minMemory and onExceed apply only to mode PerClaim"
// +kubebuilder:validation:XValidation:rule="!has(self.minMemory) || !isQuantity(string(self.minMemory)) || !isQuantity((has(self.memoryStep) ? string(self.memoryStep) : '1Gi')) || !(quantity(string(self.minMemory)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self.minMemory)).compareTo(quantity('64Ti')) <= 0) || !(quantity((has(self.memoryStep) ? string(self.memoryStep) : '1Gi')).compareTo(quantity('1Mi')) >= 0 && quantity((has(self.memoryStep) ? string(self.memoryStep) : '1Gi')).compareTo(quantity('64Ti')) <= 0) || !(quantity((has(self.memoryStep) ? string(self.memoryStep) : '1Gi')).sub(int(quantity((has(self.memoryStep) ? string(self.memoryStep) : '1Gi')).asApproximateFloat() / 1048576.0 + 0.5) * 1048576).compareTo(quantity('0')) == 0) || (quantity(string(self.minMemory)).sub(int(quantity(string(self.minMemory)).asApproximateFloat() / 1048576.0 + 0.5) * 1048576).compareTo(quantity('0')) == 0 && int(quantity(string(self.minMemory)).asApproximateFloat() / 1048576.0 + 0.5) % int(quantity((has(self.memoryStep) ? string(self.memoryStep) : '1Gi')).asApproximateFloat() / 1048576.0 + 0.5) == 0)",message="sizing.minMemory: must be a multiple of memoryStep (1Gi when unset)",messageExpression="'sizing.minMemory: ' + string(self.minMemory) + ' is not a multiple of memoryStep ' + (has(self.memoryStep) ? string(self.memoryStep) : '1Gi') + '; round it to one, or pick a step that divides it'"
type Sizing struct {
	// mode is Fixed (default: the policy's replicas) or PerClaim (each ResourceClaim's size).
	// +kubebuilder:default=Fixed
	// +optional
	Mode SizingMode `json:"mode,omitempty"`

	// memoryStep is the granularity of a claim's memory: a request is rounded up to a multiple of it.
	// A whole number of MiB (MPS takes its limit in MiB) from 1Mi to 64Ti, judged by value: 1536Mi,
	// 1.5Gi and 1610612736 are the same step. Omitted: 1Gi. A step the GPU cannot hold twice over with
	// minMemory is refused by the agent (SizingDoesNotFit).
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self))",message="sizing.memoryStep: must be a quantity of bytes such as 512Mi, 1.5Gi or 1610612736"
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || (quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('64Ti')) <= 0)",message="sizing.memoryStep: must be at least 1Mi and at most 64Ti, such as 512Mi",messageExpression="'sizing.memoryStep: ' + string(self) + ' is out of range: must be at least 1Mi and at most 64Ti, such as 512Mi'"
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || quantity(string(self)).compareTo(quantity('1Mi')) < 0 || quantity(string(self)).compareTo(quantity('64Ti')) > 0 || quantity(string(self)).sub(int(quantity(string(self)).asApproximateFloat() / 1048576.0 + 0.5) * 1048576).compareTo(quantity('0')) == 0",message="sizing.memoryStep: must be a whole number of MiB such as 512Mi, 1536Mi or 1.5Gi",messageExpression="'sizing.memoryStep: ' + string(self) + ' is not a whole number of MiB (MPS takes memory limits in MiB); use a multiple of 1Mi such as 512Mi, 1536Mi or 1.5Gi'"
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	MemoryStep *resource.Quantity `json:"memoryStep,omitempty"`

	// minMemory is the least memory a claim gets (a smaller request is rounded up to it); a multiple of
	// memoryStep, at most 64Ti. Omitted: memoryStep.
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self))",message="sizing.minMemory: must be a quantity of bytes such as 4Gi, 2.5Gi or 2684354560"
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || (quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('64Ti')) <= 0)",message="sizing.minMemory: must be at least 1Mi and at most 64Ti, such as 4Gi",messageExpression="'sizing.minMemory: ' + string(self) + ' is out of range: must be at least 1Mi and at most 64Ti, such as 4Gi'"
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	MinMemory *resource.Quantity `json:"minMemory,omitempty"`

	// onExceed is what the agent does when a pod's processes hold more of the GPU's memory than its
	// claims were allocated, which only a process that dropped the limits its claim set can do: Report
	// (omitted) or Evict. The agent checks every 2 s while the GPU has claims. Changing it is not
	// disruptive.
	// +optional
	OnExceed ExceedAction `json:"onExceed,omitempty"`
}

// Evicts says whether a pod over its claims is evicted.
func (s *Sizing) Evicts() bool { return s != nil && s.OnExceed == ExceedEvict }

// PerClaim says whether s sizes its shares per claim; nil is Fixed.
func (s *Sizing) PerClaim() bool { return s != nil && s.Mode == SizingPerClaim }

// Step is the memory step in bytes, DefaultMemoryStep where unset.
func (s *Sizing) Step() int64 {
	if s == nil || s.MemoryStep == nil || s.MemoryStep.Value() <= 0 {
		def := resource.MustParse(DefaultMemoryStep)
		return def.Value()
	}
	return s.MemoryStep.Value()
}

// Min is the least memory of a claim in bytes: minMemory, or the step where unset.
func (s *Sizing) Min() int64 {
	if s == nil || s.MinMemory == nil || s.MinMemory.Value() <= 0 {
		return s.Step()
	}
	return s.MinMemory.Value()
}

// MPSSharing configures the MPS control daemon of a GPU and the shares it is cut into.
type MPSSharing struct {
	// replicas is how many pods may share the GPU as MPS clients (MPS serves at most 48 clients per GPU).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=48
	// +required
	Replicas int32 `json:"replicas"`

	// activeThreadPercentage caps the share of the GPU's SMs each client may use, 1-100. Omitted: 100/replicas.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	ActiveThreadPercentage *int32 `json:"activeThreadPercentage,omitempty"`

	// pinnedMemoryLimit caps the device memory each client may allocate (for example 18Gi), from 1Mi to
	// 64Ti; MPS takes it in whole MiB, so a fraction of a MiB is dropped (18G is 17166Mi).
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self))",message="mps.pinnedMemoryLimit: must be a quantity of bytes such as 18Gi, 17.5Gi or 19327352832"
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || (quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('64Ti')) <= 0)",message="mps.pinnedMemoryLimit: must be at least 1Mi and at most 64Ti (MPS takes whole MiB, rounding down), such as 18Gi",messageExpression="'mps.pinnedMemoryLimit: ' + string(self) + ' is out of range: must be at least 1Mi and at most 64Ti (MPS takes whole MiB, rounding down), such as 18Gi'"
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	PinnedMemoryLimit *resource.Quantity `json:"pinnedMemoryLimit,omitempty"`
}

// TimeSliceInterval names one of the driver's time-slice lengths (nvidia-smi compute-policy --set-timeslice).
// +kubebuilder:validation:Enum=Default;Short;Medium;Long
type TimeSliceInterval string

const (
	// TimeSliceDefault leaves the driver's default time slice.
	TimeSliceDefault TimeSliceInterval = "Default"
	// TimeSliceShort is the driver's short time slice.
	TimeSliceShort TimeSliceInterval = "Short"
	// TimeSliceMedium is the driver's medium time slice.
	TimeSliceMedium TimeSliceInterval = "Medium"
	// TimeSliceLong is the driver's long time slice.
	TimeSliceLong TimeSliceInterval = "Long"
)

// TimeSlicingSharing configures time-sliced sharing of a GPU.
type TimeSlicingSharing struct {
	// replicas is how many pods may share the GPU; at least 2 (one is Exclusive).
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=64
	// +required
	Replicas int32 `json:"replicas"`

	// interval is the driver's time-slice length: Default, Short, Medium or Long.
	// +kubebuilder:default=Default
	// +optional
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// MIGSharing is the MIG layout wanted on a GPU: how many instances of each profile.
// +kubebuilder:validation:XValidation:rule="has(self.instances) || has(self.dynamic)",message="mig: set instances (a fixed layout), dynamic (instances created for claims), or both"
// +kubebuilder:validation:XValidation:rule="!has(self.instances) || self.instances.map(i, i.count).sum() <= 7",message="mig.instances: counts add up to more than 7 instances; no GPU offers more than 7"
// +kubebuilder:validation:XValidation:rule="!has(self.instances) || self.instances.map(i, int(i.profile.split('g.')[0]) * i.count).sum() <= 7",message="mig.instances: the profiles need more than 7 compute slices (the sum of <N>g x count); no GPU has more than 7"
// +kubebuilder:validation:XValidation:rule="!has(self.instances) || !has(self.dynamic) || self.instances.map(i, int(i.profile.split('g.')[0]) * i.count).sum() + self.dynamic.profiles.map(p, int(p.split('g.')[0])).min() <= 7",message="mig.dynamic: the fixed instances leave no compute slice for the smallest dynamic profile (fixed <N>g x count plus the smallest dynamic <N>g exceeds 7)"
type MIGSharing struct {
	// instances lists each profile at most once with its count, for example 3g.40gb x1 and 1g.10gb x4:
	// instances the agent creates ahead and keeps. With dynamic, they stay beside the instances
	// created for claims.
	// +listType=map
	// +listMapKey=profile
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=7
	// +optional
	Instances []MIGInstanceRequest `json:"instances,omitempty"`

	// dynamic lets ResourceClaims create MIG instances: the GPU publishes one DRA device per possible
	// placement of each allowed profile, consuming the GPU's memory and compute slices (partitionable
	// devices), and the agent creates an instance where the scheduler allocated a claim and destroys it
	// when the claim is unprepared. Changing the allowed profiles drains only the pods whose instances'
	// profile is no longer allowed.
	// +optional
	Dynamic *DynamicMIG `json:"dynamic,omitempty"`
}

// MIGInstanceRequest asks for count instances of one MIG profile.
type MIGInstanceRequest struct {
	// profile is a GPU instance profile name as nvidia-smi prints it: <slices>g.<memory>gb with an
	// optional suffix (+me, +me.all, -me or +gfx), for example 1g.10gb, 3g.40gb or 1g.10gb+me.
	// +kubebuilder:validation:Pattern=`^[1-7]g\.[1-9][0-9]{0,2}gb(\+me|\+me\.all|-me|\+gfx)?$`
	// +kubebuilder:validation:MaxLength=20
	// +required
	Profile string `json:"profile"`

	// count is how many instances of the profile, at least 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	// +required
	Count int32 `json:"count"`
}

// AntiThrashing says when the shim's lock serializes clients.
// +kubebuilder:validation:Enum=Auto;Always;Off
type AntiThrashing string

const (
	// AntiThrashingAuto serializes clients only while their working sets do not fit the budget together.
	AntiThrashingAuto AntiThrashing = "Auto"
	// AntiThrashingAlways always serializes clients with the time quantum.
	AntiThrashingAlways AntiThrashing = "Always"
	// AntiThrashingOff never serializes clients; memory is still swapped to stay within the budget.
	AntiThrashingOff AntiThrashing = "Off"
)

// Oversubscription configures the in-pod shim and the agent's per-GPU scheduler.
type Oversubscription struct {
	// timeQuantum is how long a client may hold the GPU while others wait; at least 1s.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="oversubscription.timeQuantum: must be at least 1s"
	// +kubebuilder:default="20s"
	// +optional
	TimeQuantum *metav1.Duration `json:"timeQuantum,omitempty"`

	// antiThrashing: Auto (default) locks only when working sets do not fit together; Always; Off.
	// +kubebuilder:default=Auto
	// +optional
	AntiThrashing AntiThrashing `json:"antiThrashing,omitempty"`

	// memoryBudget caps the physical GPU memory all shim clients may hold at once, from 1Mi to 64Ti
	// (a fraction of a byte rounds up); above the GPU's memory it is the GPU's memory. Omitted: the GPU's
	// memory less the agent's reserve.
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self))",message="oversubscription.memoryBudget: must be a quantity of bytes such as 16Gi, 15.5Gi or 17179869184"
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || (quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('64Ti')) <= 0)",message="oversubscription.memoryBudget: must be at least 1Mi and at most 64Ti, such as 16Gi",messageExpression="'oversubscription.memoryBudget: ' + string(self) + ' is out of range: must be at least 1Mi and at most 64Ti, such as 16Gi'"
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	MemoryBudget *resource.Quantity `json:"memoryBudget,omitempty"`
}
