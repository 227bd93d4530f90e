package dra

// The agent writes its own node's ResourceSlices and reads the Node that owns them.
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=get;list;create;update;delete
