package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RightsizingMode says what is done with a workload's recommendation.
// +kubebuilder:validation:Enum=Off;Initial
type RightsizingMode string

// Right-sizing modes.
const (
	// RightsizingOff: recommend only; no claim is changed. The default.
	RightsizingOff RightsizingMode = "Off"
	// RightsizingInitial: a claim created from a template for a new pod of the workload gets the
	// recommended memory at admission; claims that exist are never changed.
	RightsizingInitial RightsizingMode = "Initial"
)

// Right-sizing opt-in and bounds: a label or annotation on the namespace, an annotation on the workload
// (Deployment, StatefulSet, Job, CronJob or bare pod). The workload's annotation wins over the namespace's.
const (
	// RightsizingModeKey is the label or annotation whose value (Off or Initial) sets the mode.
	RightsizingModeKey = "gpusharing.io/rightsizing"
	// RightsizingMinMemoryKey and RightsizingMaxMemoryKey are namespace annotations an admin sets to
	// bound what Initial gives a claim (quantities such as 2Gi).
	RightsizingMinMemoryKey = "gpusharing.io/rightsizing-min-memory"
	RightsizingMaxMemoryKey = "gpusharing.io/rightsizing-max-memory"
)

// WorkloadKind is the kind of a pod's top owner.
// +kubebuilder:validation:Enum=Deployment;ReplicaSet;StatefulSet;DaemonSet;Job;CronJob;Pod
type WorkloadKind string

// Workload kinds.
const (
	// WorkloadDeployment: pods of a ReplicaSet a Deployment owns.
	WorkloadDeployment WorkloadKind = "Deployment"
	// WorkloadReplicaSet: pods of a ReplicaSet no Deployment owns.
	WorkloadReplicaSet WorkloadKind = "ReplicaSet"
	// WorkloadStatefulSet: pods of a StatefulSet.
	WorkloadStatefulSet WorkloadKind = "StatefulSet"
	// WorkloadDaemonSet: pods of a DaemonSet.
	WorkloadDaemonSet WorkloadKind = "DaemonSet"
	// WorkloadJob: pods of a Job no CronJob owns.
	WorkloadJob WorkloadKind = "Job"
	// WorkloadCronJob: pods of the Jobs a CronJob owns.
	WorkloadCronJob WorkloadKind = "CronJob"
	// WorkloadPod: a pod with no controller.
	WorkloadPod WorkloadKind = "Pod"
)

// WorkloadRef names a workload in the recommendation's namespace.
type WorkloadRef struct {
	// kind is the workload's kind: the pod's top owner.
	// +required
	Kind WorkloadKind `json:"kind"`
	// name is the workload's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// GPUShareRecommendationSpec names what is recommended for; the manager writes it when it first sees the
// workload's pods on a sized GPU.
type GPUShareRecommendationSpec struct {
	// workload is the pods' top owner.
	// +required
	Workload WorkloadRef `json:"workload"`
	// podClaim is the name of the claim in the pod's spec (spec.resourceClaims[].name) whose claims are
	// recommended for.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="podClaim: must be a DNS label such as gpu"
	// +required
	PodClaim string `json:"podClaim"`
	// request is the name of the request in the claim whose memory is recommended.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="request: must be a DNS label such as gpu"
	// +required
	Request string `json:"request"`
}

// RecommendedMemory is a memory recommendation with its range.
type RecommendedMemory struct {
	// target is the highest pod peak still in the history plus the safety margin.
	// +optional
	Target *resource.Quantity `json:"target,omitempty"`
	// lowerBound is the median pod peak plus the margin: a claim below it fails half the pods.
	// +optional
	LowerBound *resource.Quantity `json:"lowerBound,omitempty"`
	// upperBound widens the target by 1/sqrt(samples): loose with few pods, tight with many.
	// +optional
	UpperBound *resource.Quantity `json:"upperBound,omitempty"`
}

// RecommendedCompute is a compute recommendation in percent of the GPU's SMs; absent where no SM use was
// read (MIG takes no per-process samples).
type RecommendedCompute struct {
	// target is the 90th percentile of the readings plus the margin.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	Target int32 `json:"target,omitempty"`
	// lowerBound is the median plus the margin.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	LowerBound int32 `json:"lowerBound,omitempty"`
	// upperBound is the 95th percentile plus the margin.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	UpperBound int32 `json:"upperBound,omitempty"`
}

// HistogramBucket is one non-empty bucket of a checkpointed histogram.
type HistogramBucket struct {
	// index is the bucket's index in the histogram's exponential layout.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +required
	Index int32 `json:"index"`
	// weight is the bucket's weight, scaled so the heaviest is 10000.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	Weight int32 `json:"weight"`
}

// HistogramCheckpoint is a decaying histogram saved across manager restarts.
type HistogramCheckpoint struct {
	// reference is the time a weight stands for: a sample added a half-life later weighs twice as much.
	// +optional
	Reference *metav1.Time `json:"reference,omitempty"`
	// buckets are the non-empty buckets.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=200
	// +optional
	Buckets []HistogramBucket `json:"buckets,omitempty"`
}

// RecommendationHistory is what the recommendation is computed from, kept so a restart loses nothing.
type RecommendationHistory struct {
	// firstSample is when the first sample came in.
	// +optional
	FirstSample *metav1.Time `json:"firstSample,omitempty"`
	// memorySamples counts the pod peaks (one per pod per day) and over-claim bumps taken in.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MemorySamples int64 `json:"memorySamples,omitempty"`
	// computeSamples counts the SM readings taken in.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ComputeSamples int64 `json:"computeSamples,omitempty"`
	// memory is the histogram of pod memory peaks, in bytes.
	// +optional
	Memory HistogramCheckpoint `json:"memory,omitempty"`
	// compute is the histogram of SM readings, in percent.
	// +optional
	Compute HistogramCheckpoint `json:"compute,omitempty"`
	// overClaims lists the claims whose pods were seen over them (namespace-local names), so each counts
	// once; at most 64, the newest last.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +optional
	OverClaims []string `json:"overClaims,omitempty"`
}

// GPUShareRecommendationStatus is the recommendation, written by the manager.
type GPUShareRecommendationStatus struct {
	// mode is the mode in force: the workload's annotation, else the namespace's label or annotation,
	// else Off.
	// +optional
	Mode RightsizingMode `json:"mode,omitempty"`
	// claimMemory is the memory the workload's newest claim was allocated.
	// +optional
	ClaimMemory *resource.Quantity `json:"claimMemory,omitempty"`
	// memory is the memory recommendation; absent until enough samples came in.
	// +optional
	Memory *RecommendedMemory `json:"memory,omitempty"`
	// compute is the compute recommendation.
	// +optional
	Compute *RecommendedCompute `json:"compute,omitempty"`
	// initialMemory is memory.target fitted to the GPUs' sizing (rounded up to memoryStep, at least
	// minMemory) and to the namespace's bounds: what Initial gives a new claim.
	// +optional
	InitialMemory *resource.Quantity `json:"initialMemory,omitempty"`
	// memoryFreed is what each of the workload's claims would free at initialMemory: claimMemory less
	// initialMemory, never below zero.
	// +optional
	MemoryFreed *resource.Quantity `json:"memoryFreed,omitempty"`
	// samples counts the pod peaks behind memory.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Samples int64 `json:"samples,omitempty"`
	// podNamePattern is the RE2 pattern the names of the workload's pods match (for a Deployment
	// <name>-<pod-template-hash>-<5 chars>): admission finds a new claim's workload through its owner
	// pod's name, since the pod's other owners are not known to it.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	PodNamePattern string `json:"podNamePattern,omitempty"`
	// history is the histograms the recommendation comes from.
	// +optional
	History RecommendationHistory `json:"history,omitempty"`
	// conditions: Recommended (True once enough samples came in; False with NotEnoughSamples or
	// BoundsInvalid).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types on GPUShareRecommendation.
const (
	// ConditionRecommended is True when the recommendation has enough samples behind it (reason
	// Recommended), False while it has not (NotEnoughSamples) or the namespace's bounds cannot be read
	// (BoundsInvalid).
	ConditionRecommended = "Recommended"
)

// Reasons on GPUShareRecommendation's Recommended condition.
const (
	// ReasonRecommended: enough pod peaks came in; status.memory holds the recommendation. What to do:
	// read it; set the mode to Initial to give new claims initialMemory.
	ReasonRecommended = "Recommended"
	// ReasonNotEnoughSamples: fewer pod peaks or less history than a recommendation needs. What to do:
	// wait; the message says how many samples and how much time are missing.
	ReasonNotEnoughSamples = "NotEnoughSamples"
	// ReasonBoundsInvalid: a namespace's rightsizing-min-memory or rightsizing-max-memory annotation is
	// not a quantity, or the minimum exceeds the maximum; Initial then sizes no claim. What to do: fix the
	// annotation the message names.
	ReasonBoundsInvalid = "BoundsInvalid"
)

// GPUShareRecommendation is the recommended size of one sized request of a workload's GPU claims, from
// what the workload's pods held and used. The manager creates and updates it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=gsr;gpurec,categories=gpusharing
// +kubebuilder:printcolumn:name="Workload",type=string,JSONPath=`.spec.workload.name`
// +kubebuilder:printcolumn:name="Kind",type=string,priority=1,JSONPath=`.spec.workload.kind`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.mode`
// +kubebuilder:printcolumn:name="Claim",type=string,JSONPath=`.status.claimMemory`
// +kubebuilder:printcolumn:name="Recommended",type=string,JSONPath=`.status.initialMemory`
// +kubebuilder:printcolumn:name="Samples",type=integer,JSONPath=`.status.samples`
// +kubebuilder:printcolumn:name="Frees",type=string,JSONPath=`.status.memoryFreed`
// +kubebuilder:printcolumn:name="Target",type=string,priority=1,JSONPath=`.status.memory.target`
// +kubebuilder:printcolumn:name="Compute",type=integer,priority=1,JSONPath=`.status.compute.target`
// +kubebuilder:printcolumn:name="Reason",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Recommended")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GPUShareRecommendation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the workload, claim and request.
	// +required
	Spec GPUShareRecommendationSpec `json:"spec"`
	// status is the recommendation.
	// +optional
	Status GPUShareRecommendationStatus `json:"status,omitempty"`
}

// GPUShareRecommendationList is a list of GPUShareRecommendation.
// +kubebuilder:object:root=true
type GPUShareRecommendationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the recommendations.
	Items []GPUShareRecommendation `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GPUShareRecommendation{}, &GPUShareRecommendationList{})
}
