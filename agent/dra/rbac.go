package dra

// The markers of this package make a ClusterRole of their own, agent-dra (make manifests), which is bound
// to the agent only where it serves DRA (config/dra; the chart's agent.deviceInterface DRA or Both): an
// agent that serves the device plugin alone holds no ResourceSlice right.

// The agent's ResourceSlice controller lists and watches its own node's ResourceSlices (field selectors
// on spec.nodeName and spec.driver) and writes them; it reads the Node that owns them (the agent's
// role has nodes get).
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=list;watch;create;update;delete

// The kubelet plugin reads the claims the kubelet asks it to prepare (get); the drain lists the claims to
// find the pods holding a GPU's devices (list).
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get;list

// The device status writer (devicestatus.go) applies the use of the sized devices of the claims this
// node prepared into their status.devices. The API server also asks, for each driver whose entries
// change, the verb on the synthetic resourceclaims/driver subresource named for the driver;
// associated-node: only for claims allocated on the node the agent's token is bound to.
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims/status,verbs=patch
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims/driver,resourceNames=gpu.gpusharing.io,verbs="associated-node:patch"
