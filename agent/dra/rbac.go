package dra

// The agent writes its own node's ResourceSlices and reads the Node that owns them.
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=get;list;create;update;delete

// The kubelet plugin reads the claims the kubelet asks it to prepare (get); the drain lists the claims to
// find the pods holding a GPU's devices (list).
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get;list
