package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// GPUSharingPolicySpec declares how the GPUs it selects are shared.
type GPUSharingPolicySpec struct {
	// priority decides between policies that select the same GPU: the higher wins; equal priority is a
	// conflict reported on both policies. 0-1000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=0
	// +optional
	Priority int32 `json:"priority,omitempty"`

	// nodeSelector picks the nodes whose GPUs this policy may configure, by their labels. Omitted or empty:
	// every GPU node.
	// +optional
	NodeSelector *NodeSelector `json:"nodeSelector,omitempty"`

	// gpus narrows the policy to some GPUs of the selected nodes. Omitted: every GPU of those nodes.
	// +optional
	GPUs *GPUSelector `json:"gpus,omitempty"`

	// sharing says how the selected GPUs are shared.
	// +required
	Sharing Sharing `json:"sharing"`

	// rollout limits how disruptive changes (MIG layout, strategy) reach the nodes.
	// +kubebuilder:default={maxUnavailable: 1}
	// +optional
	Rollout Rollout `json:"rollout,omitempty"`
}

// NodeSelector is a label selector (the same fields and meaning as metav1.LabelSelector) whose sizes are
// bounded so the API server can afford to validate it at admission.
type NodeSelector struct {
	// matchLabels selects nodes that carry every one of these labels.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="nodeSelector.matchLabels: every key must be a valid label key ([prefix/]name, name up to 63 characters)"
	// +optional
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// matchExpressions selects nodes whose labels satisfy every requirement.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	MatchExpressions []NodeSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelValue is a label value: up to 63 letters, digits, '-', '_' or '.', alphanumeric at both ends.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
type LabelValue string

// LabelSelectorOperator is a label selector requirement's operator.
// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
type LabelSelectorOperator string

// NodeSelectorRequirement is one requirement of a NodeSelector, as in metav1.LabelSelectorRequirement.
// +kubebuilder:validation:XValidation:rule="self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",message="nodeSelector.matchExpressions: values must be non-empty for In and NotIn and empty for Exists and DoesNotExist"
type NodeSelectorRequirement struct {
	// key is the label key the requirement applies to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	// +required
	Key string `json:"key"`

	// operator is In, NotIn, Exists or DoesNotExist.
	// +required
	Operator LabelSelectorOperator `json:"operator"`

	// values must be non-empty for In and NotIn and empty for Exists and DoesNotExist.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Values []LabelValue `json:"values,omitempty"`
}

// GPUSelector picks GPUs of a node by one of product name, index or UUID, as the agent reports them.
// +kubebuilder:validation:XValidation:rule="[has(self.products), has(self.indices), has(self.uuids)].filter(x, x).size() == 1",message="gpus: set exactly one of products, indices or uuids (omit gpus to select every GPU)"
type GPUSelector struct {
	// products lists product names as NVML reports them, for example "NVIDIA H100 80GB HBM3".
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=96
	// +listType=set
	// +optional
	Products []string `json:"products,omitempty"`

	// indices lists NVML device indices, 0-63.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=0
	// +kubebuilder:validation:items:Maximum=63
	// +listType=set
	// +optional
	Indices []int32 `json:"indices,omitempty"`

	// uuids lists GPU UUIDs, for example GPU-5e9d3b5c-8d2f-4b0e-9a1d-1f2e3d4c5b6a.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:Pattern=`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
	// +listType=set
	// +optional
	UUIDs []string `json:"uuids,omitempty"`
}

// DrainMode says how a GPU is emptied before a disruptive change.
// +kubebuilder:validation:Enum=WaitForIdle;Evict
type DrainMode string

const (
	// DrainWaitForIdle stops advertising the GPU and waits for its pods to end.
	DrainWaitForIdle DrainMode = "WaitForIdle"
	// DrainEvict evicts the GPU's pods through the eviction API, so PodDisruptionBudgets hold.
	DrainEvict DrainMode = "Evict"
)

// Rollout limits how disruptive changes are rolled out.
type Rollout struct {
	// maxUnavailable is how many nodes may have a disruptive change in flight at once: a count >= 1 or a
	// percentage of the matched nodes such as 25% (rounded down, at least one node).
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="rollout.maxUnavailable: must be an integer >= 1 or a percentage from 1% to 100%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:default=1
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// drain says how a GPU is emptied before a disruptive change.
	// +optional
	Drain *Drain `json:"drain,omitempty"`
}

// Drain configures how a GPU is emptied before a disruptive change.
type Drain struct {
	// mode is WaitForIdle (default) or Evict.
	// +kubebuilder:default=WaitForIdle
	// +optional
	Mode DrainMode `json:"mode,omitempty"`

	// timeout bounds the drain; when it passes the change is rolled back and the GPU reported Degraded.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="drain.timeout: must be between 0s and 24h"
	// +kubebuilder:default="10m"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// GPUSharingPolicyStatus is the controller's view of how the policy is applied.
type GPUSharingPolicyStatus struct {
	// observedGeneration is the generation the status reflects; set only after a clean pass.
	// It defaults to 0, so an object no controller has seen yet reads as not observed (kstatus InProgress)
	// rather than as having no generation to compare.
	// +kubebuilder:default=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// matchedNodes is how many nodes have at least one GPU this policy wins.
	// +optional
	MatchedNodes int32 `json:"matchedNodes"`

	// matchedGPUs is how many GPUs this policy wins.
	// +optional
	MatchedGPUs int32 `json:"matchedGPUs"`

	// readyGPUs is how many of them the agents report applied as desired.
	// +optional
	ReadyGPUs int32 `json:"readyGPUs"`

	// conditions: Ready, Progressing, Degraded, Conflicted, and kstatus's Stalled and Reconciling.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GPUSharingPolicy declares how a set of GPUs is shared.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=gsp;gpupolicy,categories=gpusharing
// +kubebuilder:printcolumn:name="Strategy",type=string,JSONPath=`.spec.sharing.strategy`
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.matchedNodes`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.matchedGPUs`
// +kubebuilder:printcolumn:name="Ready GPUs",type=integer,JSONPath=`.status.readyGPUs`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Message",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GPUSharingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the admin declares.
	// +required
	Spec GPUSharingPolicySpec `json:"spec"`

	// status is what the controller observes.
	// Defaulted to {} so that status.observedGeneration exists (0) from creation on.
	// +kubebuilder:default={}
	// +optional
	Status GPUSharingPolicyStatus `json:"status,omitempty"`
}

// GPUSharingPolicyList is a list of GPUSharingPolicy.
// +kubebuilder:object:root=true
type GPUSharingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUSharingPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GPUSharingPolicy{}, &GPUSharingPolicyList{})
}
