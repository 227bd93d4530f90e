package node

// The agent reads and writes only its own node's GPUNode, emits events about it, and reads its Node to
// own the GPUNode (so deleting the Node deletes it), through a cache restricted to its own name by a
// field selector, which still takes list and watch. The drain reads the pods the kubelet reports on a
// GPU (to tell an ended pod from a running one) and evicts them through the Eviction API (Evict mode).
// It creates its GPUNode (with the Node as owner) and then writes only status, with update: no update or
// patch of the object itself, no status patch (a stolen agent token can change no spec, label or owner).
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpunodes,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=gpusharing.io,resources=gpunodes/status,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
