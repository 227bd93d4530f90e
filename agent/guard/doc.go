// Package guard holds the agent's checks of what pods do on shared GPUs beyond what the sharing itself
// enforces: the unmanaged check (unmanaged.go), which names a pod's process that holds a context on a GPU
// without being a client of what shares it, with its status, events, evictions and metric.
package guard
