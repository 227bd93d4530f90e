package v1alpha1

// DynamicMIG is which MIG instances ResourceClaims may have created on a GPU (docs/dra.md, "MIG from
// demand").
type DynamicMIG struct {
	// profiles lists the GPU instance profiles a claim may ask for, each once, for example 1g.10gb,
	// 2g.20gb, 3g.40gb. A profile the GPU does not offer leaves the GPU as it was, with reason
	// LayoutDoesNotFit.
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Pattern=`^[1-7]g\.[1-9][0-9]{0,2}gb(\+me|\+me\.all|-me|\+gfx)?$`
	// +kubebuilder:validation:items:MaxLength=20
	// +required
	Profiles []string `json:"profiles"`
}

// DynamicMIGStatus is a dynamic MIG GPU as the agent applies it.
type DynamicMIGStatus struct {
	// profiles are the profiles claims may ask for, as in force.
	// +listType=atomic
	// +optional
	Profiles []string `json:"profiles,omitempty"`
	// freeSlices are the memory slices no instance holds, for example "0-3,6" ("none" when full).
	// +optional
	FreeSlices string `json:"freeSlices,omitempty"`
	// freeComputeSlices is how many of the GPU's compute slices no instance holds.
	// +optional
	FreeComputeSlices int32 `json:"freeComputeSlices"`
}

// MIGClaimRef names the ResourceClaim a dynamic MIG instance was created for.
type MIGClaimRef struct {
	// namespace and name are the claim's.
	// +required
	Namespace string `json:"namespace"`
	// +required
	Name string `json:"name"`
	// uid is the claim's uid.
	// +required
	UID string `json:"uid"`
	// pods are the pods the claim was reserved for when it was prepared.
	// +listType=atomic
	// +optional
	Pods []string `json:"pods,omitempty"`
}
