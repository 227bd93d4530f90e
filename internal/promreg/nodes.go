package promreg

import "sync"

// Nodes holds, per node name, what a shared collector reads at scrape time: every agent of the process
// adds its own to the collector registered first (Register). The zero value is ready to use.
type Nodes[T any] struct {
	mu sync.Mutex
	m  map[string]T
}

// Add sets the node's source, replacing one added before under that name.
func (n *Nodes[T]) Add(node string, v T) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]T{}
	}
	n.m[node] = v
}

// Snapshot copies the sources, so a scrape reads them without holding the lock.
func (n *Nodes[T]) Snapshot() map[string]T {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]T, len(n.m))
	for k, v := range n.m {
		out[k] = v
	}
	return out
}
