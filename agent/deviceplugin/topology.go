package deviceplugin

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"

	gpuinfo "github.com/gpusharing/gpusharing/agent/gpu"
)

// topologyTimeout bounds one read of the GPUs' topology inside a GetPreferredAllocation call, which
// the kubelet makes while admitting a pod.
const topologyTimeout = 2 * time.Second

// topologySource reads the GPUs' topology when an allocation first needs it and keeps it: the links
// between GPUs do not change while the node runs. A failed read is tried again at the next allocation;
// meanwhile GPUs are chosen by use and order alone. A nil source knows no topology.
type topologySource struct {
	mu   sync.Mutex
	r    gpuinfo.TopologyReader
	t    gpuinfo.Topology
	read bool
}

func (s *topologySource) get(ctx context.Context) gpuinfo.Topology {
	if s == nil {
		return gpuinfo.Topology{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.read || s.r == nil {
		return s.t
	}
	ctx, cancel := context.WithTimeout(ctx, topologyTimeout)
	defer cancel()
	t, err := s.r.Topology(ctx)
	if err != nil {
		logr.FromContextOrDiscard(ctx).Info("Choosing GPUs without their topology", "err", err.Error())
		return gpuinfo.Topology{}
	}
	s.t, s.read = t, true
	return t
}

// SetTopology gives the manager the GPUs' topology, so a container's shares go to the closest GPUs.
// Call it before Run.
func (m *Manager) SetTopology(r gpuinfo.TopologyReader) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.topology = &topologySource{r: r}
}
