package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GPUNodeSpec is the desired sharing of each GPU of one node. The controller owns it.
type GPUNodeSpec struct {
	// Both GPU lists check uuids with distinct(), which reads each uuid once: the API server runs the rule
	// on every write, and the pairwise form (self.all + exists_one) read 2n² fields, each of which copies
	// the schema's property map there, 2.1 ms a write at 8 GPUs (BenchmarkGPUNodeWriteValidation).

	// gpus lists the GPUs some policy configures, one entry per uuid; a GPU not listed is left as found.
	// The controller writes the list whole.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.map(g, g.uuid).distinct().size() == self.size()",message="each GPU uuid may be listed once"
	// +optional
	GPUs []GPUDesired `json:"gpus,omitempty"`
}

// GPUDesired is the resolved sharing of one GPU and where it came from.
type GPUDesired struct {
	// uuid identifies the GPU, as the agent reports it in status.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +required
	UUID string `json:"uuid"`

	// index is the GPU's NVML index, for people reading the object.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Index int32 `json:"index"`

	// policy is the GPUSharingPolicy this desired state came from; empty for the default.
	// +optional
	Policy string `json:"policy,omitempty"`

	// policyGeneration is the generation of that policy.
	// +optional
	PolicyGeneration int64 `json:"policyGeneration,omitempty"`

	// sharing is how the GPU should be shared.
	// +required
	Sharing Sharing `json:"sharing"`

	// drain says how the agent empties the GPU before a disruptive change.
	// +optional
	Drain *Drain `json:"drain,omitempty"`
}

// GPUNodeStatus is what the agent observes on the node. The agent owns it.
type GPUNodeStatus struct {
	// observedGeneration is the spec generation the agent last acted on.
	// It defaults to 0, so an object no agent has seen yet reads as not observed (kstatus InProgress)
	// rather than as having no generation to compare.
	// +kubebuilder:default=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// driverVersion is the NVIDIA driver version, for example 580.159.
	// +optional
	DriverVersion string `json:"driverVersion,omitempty"`

	// cudaVersion is the CUDA driver API version, for example 13.0.
	// +optional
	CUDAVersion string `json:"cudaVersion,omitempty"`

	// gpuCount is how many GPUs the node has.
	// +optional
	GPUCount int32 `json:"gpuCount"`

	// appliedGPUs is how many listed GPUs have their desired sharing applied.
	// +optional
	AppliedGPUs int32 `json:"appliedGPUs"`

	// summary is one line per node for people, for example "0:MIG 1:MPS(4) 2-7:Exclusive".
	// +optional
	Summary string `json:"summary,omitempty"`

	// memoryUsed is the device memory each GPU's processes hold, in index order, for people:
	// "0:12.5Gi/80Gi 1:0/80Gi". Empty where the agent's accounting does not run.
	// +optional
	MemoryUsed string `json:"memoryUsed,omitempty"`

	// memoryAllocated is the device memory the prepared claims of each GPU sized per claim were
	// allocated, in index order, for people: "0:30Gi/80Gi". Empty where no GPU is sized per claim.
	// +optional
	MemoryAllocated string `json:"memoryAllocated,omitempty"`

	// migFree is what each dynamic MIG GPU has free, in index order, for people: "0:slices 4-7 compute 3".
	// Empty where no GPU's MIG instances come from claims.
	// +optional
	MIGFree string `json:"migFree,omitempty"`

	// production names the production pods (namespace/name) of each GPU with production classes
	// (applied.qos), in index order, for people: "0:serving/web,serving/api 1:-", at most
	// MaxProductionPodsInSummary per GPU and then "+N" for the rest; "-" is a GPU with production
	// classes and no production pod. Read from the GPU's consumers and shim clients, each of which
	// carries its class. Empty where no GPU has production classes.
	// +optional
	Production string `json:"production,omitempty"`

	// claimedBy names the pods (namespace/name) whose ResourceClaims the agent's DRA kubelet plugin
	// prepared on each GPU, in index order, for people: "0:ml/notebook 4:ml/a,ml/b". This includes the
	// claims the kube-scheduler makes for pods that ask for an extended resource served through DRA.
	// At most MaxClaimedByPodsInSummary per GPU and then "+N" for the rest; GPUs without any are left
	// out. Empty where no claim is prepared or the agent serves no DRA.
	// +optional
	ClaimedBy string `json:"claimedBy,omitempty"`

	// gpus lists each GPU's identity and what is actually applied on it, one entry per uuid. The agent
	// writes the list whole.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.map(g, g.uuid).distinct().size() == self.size()",message="each GPU uuid may be listed once"
	// +optional
	GPUs []GPUStatus `json:"gpus,omitempty"`

	// pods lists the pods whose processes use two or more of the node's GPUs, each with what it uses on
	// each of them, from the agent's accounting: the pods with the most GPUs first, then by namespace
	// and name, at most MaxPodsInStatus. A pod on one GPU is listed only among that GPU's
	// usage.consumers: listing every pod again here would double the usage part of a crowded node's
	// object, and every figure of it that moved would be written twice. Empty where the accounting
	// does not run. The agent lists each pod once; the schema does not check it: a uniqueness rule over
	// namespace and name (distinct over the joined names, or pairwise) exceeds the API server's
	// estimated CEL cost budget.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Pods []PodGPUs `json:"pods,omitempty"`

	// omittedPods counts the pods on two or more GPUs left out of pods.
	// +optional
	OmittedPods int32 `json:"omittedPods,omitempty"`

	// conditions: Ready (the agent runs and reports), Applied (every GPU as desired), and kstatus's
	// Stalled and Reconciling.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GPUStatus is one GPU's identity, capabilities and applied sharing.
type GPUStatus struct {
	// uuid is the GPU's UUID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +required
	UUID string `json:"uuid"`

	// index is the NVML index.
	// +required
	Index int32 `json:"index"`

	// product is the product name, for example "NVIDIA H100 80GB HBM3".
	// +optional
	Product string `json:"product,omitempty"`

	// minorNumber is the minor number of the GPU's device node, /dev/nvidia<minorNumber>, as NVML reports
	// it: a container gets the GPU's share as this node (and MIG instances as its capability nodes).
	// Absent where NVML does not report it; such a GPU's shares cannot be handed out.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinorNumber *int32 `json:"minorNumber,omitempty"`

	// memory is the GPU's total memory.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// migCapable says whether the GPU supports MIG.
	// +optional
	MIGCapable bool `json:"migCapable,omitempty"`

	// migMode is the current and pending MIG mode.
	// +optional
	MIGMode *MIGModeStatus `json:"migMode,omitempty"`

	// computeMode is the NVML compute mode: Default, ExclusiveProcess or Prohibited.
	// +optional
	ComputeMode string `json:"computeMode,omitempty"`

	// migProfiles lists the GPU instance profiles the GPU offers, as NVML reports them.
	// +listType=atomic
	// +optional
	MIGProfiles []MIGProfile `json:"migProfiles,omitempty"`

	// applied is what is actually in force on the GPU.
	// +optional
	Applied *AppliedSharing `json:"applied,omitempty"`

	// processes lists the pids using the GPU when that blocks a change.
	// +listType=atomic
	// +optional
	Processes []int32 `json:"processes,omitempty"`

	// drain is the agent's drain of this GPU before a disruptive change, while one runs or after one
	// failed; absent otherwise.
	// +optional
	Drain *GPUDrainStatus `json:"drain,omitempty"`

	// usage is who uses the GPU and how much, from the agent's accounting; absent where it does not run.
	// +optional
	Usage *GPUUsage `json:"usage,omitempty"`

	// sized is what the ResourceClaims the node's kubelet prepared hold of the GPU, where its shares are
	// sized per claim (applied.sizing PerClaim); absent on other GPUs and where the DRA kubelet plugin
	// does not run.
	// +optional
	Sized *GPUSizedClaims `json:"sized,omitempty"`

	// unmanaged compares the GPU's processes with the clients that manage them, where the agent checks
	// it (oversubscription, or MPS sized per claim); absent on other GPUs and where the accounting does
	// not run.
	// +optional
	Unmanaged *GPUUnmanaged `json:"unmanaged,omitempty"`

	// conditions: Applied, Healthy, on a GPU sized per claim DevicePlugin and WithinClaims, and on a GPU
	// checked for unmanaged processes Managed.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DrainPhase is where the agent's drain of one GPU stands.
// +kubebuilder:validation:Enum=Draining;TimedOut;Failed
type DrainPhase string

const (
	// DrainPhaseDraining: the GPU is cordoned (not advertised) and the agent waits for or evicts its pods.
	DrainPhaseDraining DrainPhase = "Draining"
	// DrainPhaseTimedOut: pods still used the GPU at the timeout; the GPU was left as it was and is
	// advertised again until retryTime or a spec change.
	DrainPhaseTimedOut DrainPhase = "TimedOut"
	// DrainPhaseFailed: the drain stopped on an error waiting cannot fix (an eviction refused for another
	// reason than a PodDisruptionBudget), or the change failed after the drain; retried like TimedOut.
	DrainPhaseFailed DrainPhase = "Failed"
)

// GPUDrainStatus is one GPU's drain before a disruptive change (a strategy or MIG layout change).
type GPUDrainStatus struct {
	// phase is Draining, TimedOut or Failed.
	// +required
	Phase DrainPhase `json:"phase"`
	// target is the desired sharing the drain makes room for, for example "MIG 1g.10gb x7".
	// +optional
	Target string `json:"target,omitempty"`
	// mode is WaitForIdle or Evict.
	// +optional
	Mode DrainMode `json:"mode,omitempty"`
	// timeout bounds the drain.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// startTime is when the GPU was cordoned.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// pods are the pods (namespace/name) still using the GPU, as the kubelet's PodResources API reports.
	// +listType=atomic
	// +optional
	Pods []string `json:"pods,omitempty"`
	// message is the latest step, for example an eviction a PodDisruptionBudget refuses.
	// +optional
	Message string `json:"message,omitempty"`
	// retryTime is when the agent drains again after TimedOut or Failed, unless the GPU's spec changes first.
	// +optional
	RetryTime *metav1.Time `json:"retryTime,omitempty"`
}

// MIGModeStatus is the MIG mode now and after the next GPU reset.
type MIGModeStatus struct {
	// current is Enabled or Disabled.
	// +optional
	Current string `json:"current,omitempty"`
	// pending is Enabled or Disabled.
	// +optional
	Pending string `json:"pending,omitempty"`
}

// MIGProfile is one GPU instance profile with the placements NVML offers for it.
type MIGProfile struct {
	// name is the profile name, for example 3g.40gb.
	// +required
	Name string `json:"name"`
	// id is NVML's GPU instance profile id.
	// +optional
	ID int32 `json:"id"`
	// sliceCount is the number of compute slices.
	// +optional
	SliceCount int32 `json:"sliceCount,omitempty"`
	// memory is the instance's memory.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// maxInstances is how many instances of this profile the GPU can hold alone.
	// +optional
	MaxInstances int32 `json:"maxInstances,omitempty"`
	// placements are the memory-slice ranges an instance of this profile may occupy.
	// +listType=atomic
	// +optional
	Placements []MIGPlacement `json:"placements,omitempty"`
}

// MIGPlacement is a range of memory slices.
type MIGPlacement struct {
	// start is the first memory slice.
	// +required
	Start int32 `json:"start"`
	// size is the number of memory slices.
	// +required
	Size int32 `json:"size"`
}

// AppliedSharing is what the agent has actually put in force on a GPU.
type AppliedSharing struct {
	// strategy is the strategy in force.
	// +optional
	Strategy Strategy `json:"strategy,omitempty"`
	// policy and policyGeneration name the desired state this reflects.
	// +optional
	Policy string `json:"policy,omitempty"`
	// +optional
	PolicyGeneration int64 `json:"policyGeneration,omitempty"`
	// specHash is a hash of the desired sharing this reflects, so the controller can tell it is current.
	// +optional
	SpecHash string `json:"specHash,omitempty"`
	// mps is the MPS daemon's state.
	// +optional
	MPS *MPSStatus `json:"mps,omitempty"`
	// timeSlicing is the time-slice setting in force.
	// +optional
	TimeSlicing *TimeSlicingSharing `json:"timeSlicing,omitempty"`
	// migInstances lists the MIG instances that exist.
	// +listType=atomic
	// +optional
	MIGInstances []MIGInstanceStatus `json:"migInstances,omitempty"`
	// migDynamic is set on a GPU whose MIG instances are created for claims (mig.dynamic): the
	// profiles allowed and what is free.
	// +optional
	MIGDynamic *DynamicMIGStatus `json:"migDynamic,omitempty"`
	// shim lists the shim's clients on this GPU.
	// +optional
	Shim *ShimStatus `json:"shim,omitempty"`
	// sizing is the sizing in force, set when shares are sized per claim: the desired one once applied,
	// the one before while a change to or from it drains the GPU. DRA publishes the GPU as one device
	// with consumable capacity from it, and the device plugin leaves the GPU out.
	// +optional
	Sizing *Sizing `json:"sizing,omitempty"`
	// qos is the production classes in force (sharing.qos), once applied.
	// +optional
	QoS *QoS `json:"qos,omitempty"`
	// unmanagedProcesses is the action on unmanaged processes in force (sharing.unmanagedProcesses),
	// set where the agent checks the GPU for them: Report or Evict.
	// +optional
	UnmanagedProcesses UnmanagedAction `json:"unmanagedProcesses,omitempty"`
}

// MPSDaemonState is the state of a GPU's MPS control daemon. The agent's mps package sets it and the
// device plugin reads it (devices of a daemon that is not Running are Unhealthy), so it is declared once
// here.
type MPSDaemonState string

// MPS daemon states.
const (
	// MPSDaemonStarting: the daemon was launched and its pid file or settings are not in place yet.
	MPSDaemonStarting MPSDaemonState = "Starting"
	// MPSDaemonRunning: the daemon is up with the settings in force.
	MPSDaemonRunning MPSDaemonState = "Running"
	// MPSDaemonRestarting: the daemon died and waits out its restart backoff.
	MPSDaemonRestarting MPSDaemonState = "Restarting"
	// MPSDaemonFailed: the daemon could not be started.
	MPSDaemonFailed MPSDaemonState = "Failed"
)

// MPSStatus is the state of a GPU's MPS control daemon.
type MPSStatus struct {
	// state is Starting, Running, Restarting or Failed.
	// +optional
	State MPSDaemonState `json:"state,omitempty"`
	// pid is the control daemon's pid.
	// +optional
	PID int32 `json:"pid,omitempty"`
	// clients is how many MPS clients are connected.
	// +optional
	Clients int32 `json:"clients"`
	// restarts is how often the agent restarted the daemon.
	// +optional
	Restarts int32 `json:"restarts,omitempty"`
	// replicas, activeThreadPercentage and pinnedMemoryLimit are the settings in force.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ActiveThreadPercentage int32 `json:"activeThreadPercentage,omitempty"`
	// +optional
	PinnedMemoryLimit *resource.Quantity `json:"pinnedMemoryLimit,omitempty"`
}

// MIGInstanceStatus is one MIG GPU instance with its compute instance.
type MIGInstanceStatus struct {
	// profile is the GPU instance profile name.
	// +required
	Profile string `json:"profile"`
	// placement is where the instance sits.
	// +required
	Placement MIGPlacement `json:"placement"`
	// uuid is the MIG device UUID.
	// +optional
	UUID string `json:"uuid,omitempty"`
	// gpuInstanceID and computeInstanceID are NVML's ids.
	// +optional
	GPUInstanceID int32 `json:"gpuInstanceID"`
	// +optional
	ComputeInstanceID int32 `json:"computeInstanceID"`
	// claim is the ResourceClaim a dynamic MIG instance was created for; absent on fixed instances.
	// +optional
	Claim *MIGClaimRef `json:"claim,omitempty"`
	// unhealthy says why a claim's instance is marked alone: a critical Xid on it. Its placement device is
	// tainted NoSchedule (left out where the API server drops device taints) until the instance is
	// destroyed; the GPU's other instances are not touched.
	// +optional
	Unhealthy string `json:"unhealthy,omitempty"`
}

// ShimStatus is the per-GPU scheduler's view of its clients.
type ShimStatus struct {
	// timeQuantum is the quantum in force.
	// +optional
	TimeQuantum *metav1.Duration `json:"timeQuantum,omitempty"`
	// memoryBudget is the device memory the shim clients may hold resident together; omitted when the
	// scheduler runs the lock only (the GPU has no more memory than the agent's reserve).
	// +optional
	MemoryBudget *resource.Quantity `json:"memoryBudget,omitempty"`
	// antiThrashing is the anti-thrashing mode in force: Auto, Always or Off.
	// +optional
	AntiThrashing AntiThrashing `json:"antiThrashing,omitempty"`
	// clients lists connected shim clients: holders first, then by resident memory, at most
	// MaxShimClientsInStatus (a crowded GPU must not push the GPUNode past etcd's object size limit).
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Clients []ShimClient `json:"clients,omitempty"`
	// omittedClients counts the connected clients left out of clients.
	// +optional
	OmittedClients int32 `json:"omittedClients,omitempty"`
}

// MaxShimClientsInStatus bounds status.gpus[].applied.shim.clients; the rest are counted in
// omittedClients. Eight GPUs of 32 clients stay far below etcd's 1.5 MiB object limit.
const MaxShimClientsInStatus = 32

// ShimClient is one process using the shim on a GPU.
type ShimClient struct {
	// pid is the client's process id as the agent sees it.
	// +required
	PID int32 `json:"pid"`
	// pod is namespace/name of the client's pod, when known.
	// +optional
	Pod string `json:"pod,omitempty"`
	// holding says whether it holds the GPU lock now.
	// +optional
	Holding bool `json:"holding,omitempty"`
	// priority is High or Normal: High goes first in line, and on a GPU with production classes
	// (sharing.qos) it is production's.
	// +optional
	Priority string `json:"priority,omitempty"`
	// class is Production or Opportunistic on a GPU with production classes, by its pod's priority.
	// +optional
	Class WorkloadClass `json:"class,omitempty"`
	// residentBytes is the device memory the client has resident, as it last reported.
	// +optional
	ResidentBytes int64 `json:"residentBytes,omitempty"`
	// swappedBytes is the client's memory swapped out to host staging, as it last reported.
	// +optional
	SwappedBytes int64 `json:"swappedBytes,omitempty"`
	// swapOuts and swapIns count the allocations the client copied out and back in.
	// +optional
	SwapOuts int64 `json:"swapOuts,omitempty"`
	// +optional
	SwapIns int64 `json:"swapIns,omitempty"`
	// launchBound is the launch bound in force in the client, as it last reported it (shims of protocol
	// 6): the most launches it keeps outstanding on the GPU; 0 is unbounded. Absent until it reports.
	// +kubebuilder:validation:Minimum=0
	// +optional
	LaunchBound *int64 `json:"launchBound,omitempty"`
	// launchBoundSource says where launchBound comes from.
	// +optional
	LaunchBoundSource LaunchBoundSource `json:"launchBoundSource,omitempty"`
}

// LaunchBoundSource is where a shim client's launch bound in force comes from.
// +kubebuilder:validation:Enum=Scheduler;Override;Backoff;Off
type LaunchBoundSource string

// Launch bound sources.
const (
	// LaunchBoundScheduler: the GPU scheduler's bound (its PACE; 0 where it sets none).
	LaunchBoundScheduler LaunchBoundSource = "Scheduler"
	// LaunchBoundOverride: the pod's GPUSHARE_PACE_OVERRIDE, where the scheduler allows it (the
	// standalone scheduler, for measuring; never the agent's).
	LaunchBoundOverride LaunchBoundSource = "Override"
	// LaunchBoundBackoff: pacing off for a back-off after a stall or a driver error; re-armed after it.
	LaunchBoundBackoff LaunchBoundSource = "Backoff"
	// LaunchBoundOff: pacing off for good: the driver lacks the event calls pacing needs.
	LaunchBoundOff LaunchBoundSource = "Off"
)

// GPUUsage is what a GPU's processes use, as the agent's accounting read it. The agent publishes a
// change only when a consumer comes or goes or a figure moves past a threshold (docs/accounting.md),
// so figures here lag the metrics by up to those thresholds.
type GPUUsage struct {
	// memoryUsed is the device memory the GPU's processes hold together, in pods or not (the device's
	// used memory where NVML cannot list processes).
	// +optional
	MemoryUsed *resource.Quantity `json:"memoryUsed,omitempty"`
	// processes counts the processes using the GPU.
	// +optional
	Processes int32 `json:"processes,omitempty"`
	// consumers lists the containers using the GPU, those holding the most memory first, at most
	// MaxConsumersInStatus (a crowded GPU must not push the GPUNode past etcd's object size limit).
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Consumers []GPUConsumer `json:"consumers,omitempty"`
	// omittedConsumers counts the containers left out of consumers.
	// +optional
	OmittedConsumers int32 `json:"omittedConsumers,omitempty"`
}

// GPUSizedClaims is what the prepared claims of a GPU sized per claim were allocated (their
// consumedCapacity) and use.
type GPUSizedClaims struct {
	// memoryCapacity is the device memory the GPU's sized device offers claims (its ResourceSlice
	// capacity): the GPU's memory less what the driver reserves (NVML's reserved memory) and, on MPS, the
	// MPS server's own; absent where the agent has not read it.
	// +optional
	MemoryCapacity *resource.Quantity `json:"memoryCapacity,omitempty"`
	// memoryAllocated is the device memory the claims were allocated together.
	// +optional
	MemoryAllocated *resource.Quantity `json:"memoryAllocated,omitempty"`
	// computeAllocated is the percent of the GPU's SMs the claims were allocated together.
	// +optional
	ComputeAllocated int32 `json:"computeAllocated,omitempty"`
	// claims lists the claims, the largest first, at most MaxSizedClaimsInStatus.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Claims []SizedClaimStatus `json:"claims,omitempty"`
	// omittedClaims counts the claims left out of claims.
	// +optional
	OmittedClaims int32 `json:"omittedClaims,omitempty"`
}

// MaxSizedClaimsInStatus bounds status.gpus[].sized.claims; the rest are counted in omittedClaims.
const MaxSizedClaimsInStatus = 32

// MaxSizedClaimPodsInStatus bounds the pods listed per claim (a claim may be reserved for up to 256).
const MaxSizedClaimPodsInStatus = 8

// SizedClaimStatus is one ResourceClaim's holding of a sized GPU.
type SizedClaimStatus struct {
	// namespace and name name the ResourceClaim.
	// +required
	Namespace string `json:"namespace"`
	// +required
	Name string `json:"name"`
	// pods are the pods, in the claim's namespace, it was reserved for when the kubelet prepared it; at
	// most MaxSizedClaimPodsInStatus.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Pods []string `json:"pods,omitempty"`
	// memory is the device memory the claim was allocated.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// compute is the percent of the GPU's SMs the claim was allocated.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	Compute int32 `json:"compute,omitempty"`
	// memoryUsed is the device memory its pods' processes hold on the GPU, as the accounting last read
	// it; absent where the accounting does not run or has not read the GPU.
	// +optional
	MemoryUsed *resource.Quantity `json:"memoryUsed,omitempty"`
	// allocationsRefused counts the allocations of its pods' processes the shim refused at the claim's
	// size (the GPU's scheduler's claim ledger, on a GPU with oversubscription); absent while none was.
	// +kubebuilder:validation:Minimum=0
	// +optional
	AllocationsRefused int64 `json:"allocationsRefused,omitempty"`
	// refusedDemand is the most device memory a refused allocation would have brought the claim's
	// processes to (their context charges, their grants and the bytes asked): what the claim lacked.
	// +optional
	RefusedDemand *resource.Quantity `json:"refusedDemand,omitempty"`
	// lastRefusalTime is when the agent was last told of a refused allocation of the claim.
	// +optional
	LastRefusalTime *metav1.Time `json:"lastRefusalTime,omitempty"`
}

// MaxProductionPodsInSummary bounds the pods status.production names per GPU.
const MaxProductionPodsInSummary = 3

// MaxClaimedByPodsInSummary bounds the pods status.claimedBy names per GPU.
const MaxClaimedByPodsInSummary = 3

// MaxConsumersInStatus bounds status.gpus[].usage.consumers; the rest are counted in omittedConsumers.
const MaxConsumersInStatus = 32

// GPUConsumer is one container using a GPU.
type GPUConsumer struct {
	// namespace and pod name the container's pod.
	// +required
	Namespace string `json:"namespace"`
	// +required
	Pod string `json:"pod"`
	// container is the container's name; empty while the pod's status does not list it yet.
	// +optional
	Container string `json:"container,omitempty"`
	// processes counts its processes on the GPU.
	// +optional
	Processes int32 `json:"processes,omitempty"`
	// memory is the device memory its processes hold; absent where NVML cannot read it.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// smUtilization is the percent of time its processes had kernels on the SMs; absent where the GPU
	// takes no per-process samples (MIG).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	SMUtilization *int32 `json:"smUtilization,omitempty"`
	// class is Production or Opportunistic on a GPU whose sharing sets qos (by the pod's priority
	// against qos.productionPriority); absent elsewhere.
	// +optional
	Class WorkloadClass `json:"class,omitempty"`
}

// MaxPodsInStatus bounds status.pods; the rest are counted in omittedPods. An entry takes about 110
// bytes per GPU besides the pod's name, so 32 pods of 8 GPUs add about 30 KiB to the object, and the
// most the schema admits (64 GPUs each, the longest names) about 240 KiB, below etcd's 1.5 MiB limit.
const MaxPodsInStatus = 32

// PodGPUs is one pod's use of the node's GPUs.
type PodGPUs struct {
	// namespace and name name the pod.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// gpus lists each GPU its processes use, in index order.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.map(g, g.uuid).distinct().size() == self.size()",message="each GPU uuid may be listed once"
	// +optional
	GPUs []PodGPUUsage `json:"gpus,omitempty"`
}

// PodGPUUsage is what one pod's containers use of one GPU together.
type PodGPUUsage struct {
	// uuid is the GPU's UUID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +required
	UUID string `json:"uuid"`
	// index is the GPU's NVML index.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Index int32 `json:"index"`
	// memoryUsed is the device memory the pod's processes hold on the GPU; absent where NVML cannot
	// read the memory of one of them.
	// +optional
	MemoryUsed *resource.Quantity `json:"memoryUsed,omitempty"`
	// smUtilization is the percent of time the pod's processes had kernels on the GPU's SMs, summed
	// over its containers, at most 100; absent where the GPU takes no per-process samples (MIG).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	SMUtilization *int32 `json:"smUtilization,omitempty"`
}

// WorkloadClass is a pod's class on a GPU with production classes (sharing.qos).
// +kubebuilder:validation:Enum=Production;Opportunistic
type WorkloadClass string

// Workload classes.
const (
	// ClassProduction: the pod's priority is at least qos.productionPriority.
	ClassProduction WorkloadClass = "Production"
	// ClassOpportunistic: every other pod on the GPU.
	ClassOpportunistic WorkloadClass = "Opportunistic"
)

// ClassOf is the class of a pod of priority p under q; empty where q is nil (no classes).
func ClassOf(q *QoS, p int32) WorkloadClass {
	switch {
	case q == nil:
		return ""
	case q.Production(p):
		return ClassProduction
	default:
		return ClassOpportunistic
	}
}

// GPUNode is one node's GPUs: desired sharing (spec, from the controller) against what is applied
// (status, from the node's agent). Its name is the node's name.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=gpun;gnode,categories=gpusharing
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.gpuCount`
// +kubebuilder:printcolumn:name="Applied",type=integer,JSONPath=`.status.appliedGPUs`
// +kubebuilder:printcolumn:name="Sharing",type=string,JSONPath=`.status.summary`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Applied")].reason`
// +kubebuilder:printcolumn:name="Message",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Applied")].message`
// +kubebuilder:printcolumn:name="Driver",type=string,priority=1,JSONPath=`.status.driverVersion`
// +kubebuilder:printcolumn:name="Memory Used",type=string,priority=1,JSONPath=`.status.memoryUsed`
// +kubebuilder:printcolumn:name="Memory Allocated",type=string,priority=1,JSONPath=`.status.memoryAllocated`
// +kubebuilder:printcolumn:name="MIG Free",type=string,priority=1,JSONPath=`.status.migFree`
// +kubebuilder:printcolumn:name="Production",type=string,priority=1,JSONPath=`.status.production`
// +kubebuilder:printcolumn:name="Claimed By",type=string,priority=1,JSONPath=`.status.claimedBy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GPUNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired sharing per GPU, written by the controller.
	// +optional
	Spec GPUNodeSpec `json:"spec,omitempty"`

	// status is what the agent observes, written by the agent.
	// Defaulted to {} so that status.observedGeneration exists (0) from creation on.
	// +kubebuilder:default={}
	// +optional
	Status GPUNodeStatus `json:"status,omitempty"`
}

// GPUNodeList is a list of GPUNode.
// +kubebuilder:object:root=true
type GPUNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUNode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GPUNode{}, &GPUNodeList{})
}

// GPUUnmanaged is a GPU's processes against the clients that manage them: the shim scheduler's connected
// clients (oversubscription), or the MPS server's clients (MPS sized per claim).
type GPUUnmanaged struct {
	// clients counts the GPU's processes that are managed: connected to its shim scheduler, or clients
	// of its MPS server.
	// +optional
	Clients int32 `json:"clients,omitempty"`
	// hostProcesses counts the processes on the GPU that run in no pod of the node (the MPS server,
	// nvidia-smi, DCGM, anything of the host); they are never named nor evicted.
	// +optional
	HostProcesses int32 `json:"hostProcesses,omitempty"`
	// processes lists the pods' processes that hold a context on the GPU and have not been managed for
	// the agent's grace (a process connects at its first context), the largest first, at most
	// MaxUnmanagedInStatus.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Processes []UnmanagedProcess `json:"processes,omitempty"`
	// omittedProcesses counts the unmanaged processes left out of processes.
	// +optional
	OmittedProcesses int32 `json:"omittedProcesses,omitempty"`
}

// MaxUnmanagedInStatus bounds status.gpus[].unmanaged.processes; the rest are counted in
// omittedProcesses (the metric and the events name every one).
const MaxUnmanagedInStatus = 8

// UnmanagedProcess is a pod's process on a GPU that is not managed there.
type UnmanagedProcess struct {
	// namespace and pod name the process's pod.
	// +kubebuilder:validation:MaxLength=63
	// +required
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MaxLength=253
	// +required
	Pod string `json:"pod"`
	// container is the process's container, where the agent could name it.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Container string `json:"container,omitempty"`
	// pid is the process's id as the agent sees it.
	// +required
	PID int32 `json:"pid"`
	// memory is the device memory NVML reports for the process; absent where NVML cannot read it.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
}
