package nvmlmock

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Topology is how a mock server's GPUs are connected, answered through NVML's topology calls
// (GetTopologyCommonAncestor, GetNvLinkState, GetNvLinkRemotePciInfo, GetP2PStatus) as a real server
// answers them.
type Topology struct {
	// SwitchLinks is how many NVLinks each GPU has to the server's NVSwitches; 0 means no NVSwitch.
	SwitchLinks int
	// Bridges are NVLink bridges between pairs of GPU indices (the lower first), with their link counts.
	Bridges map[[2]int]int
	// PCIe is the closest common PCIe ancestor of two GPU indices (a < b).
	PCIe func(a, b int) nvml.GpuTopologyLevel
}

// DGXTopology is a DGX's: every GPU on the NVSwitches with links each (18 on an H100, 12 on an A100),
// pairs of GPUs behind one PCIe switch tree, four per NUMA node.
func DGXTopology(links int) Topology {
	return Topology{SwitchLinks: links, PCIe: func(a, b int) nvml.GpuTopologyLevel {
		switch {
		case a/2 == b/2:
			return nvml.TOPOLOGY_MULTIPLE
		case a/4 == b/4:
			return nvml.TOPOLOGY_NODE
		}
		return nvml.TOPOLOGY_SYSTEM
	}}
}

// PCIeTopology is a server without NVLink whose GPUs' closest PCIe ancestors pcie gives.
func PCIeTopology(pcie func(a, b int) nvml.GpuTopologyLevel) Topology {
	return Topology{PCIe: pcie}
}

// topology holds a server's Topology for its GPUs' NVML calls.
type topology struct {
	mu sync.Mutex
	t  Topology
}

// SetTopology makes the server's GPUs report t from now on.
func (s *Server) SetTopology(t Topology) {
	s.topo.mu.Lock()
	s.topo.t = t
	s.topo.mu.Unlock()
}

func (s *Server) topologyNow() Topology {
	s.topo.mu.Lock()
	defer s.topo.mu.Unlock()
	return s.topo.t
}

// busID is the PCI bus id the mock gives GPU i.
func busID(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10) }

// switchBus is the PCI bus id NVLinks to the NVSwitches report as their remote end.
const switchBus = "00000000:FF:00.0"

func pciInfo(bus string, deviceID uint32) nvml.PciInfo {
	p := nvml.PciInfo{PciDeviceId: deviceID}
	for i := 0; i < len(bus) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(bus[i])
	}
	return p
}

// overrideTopology answers GPU i's topology calls from the server's Topology.
func (s *Server) overrideTopology(i int, g *GPU) {
	d := g.Device
	index := func(peer nvml.Device) (int, bool) {
		uuid, r := peer.GetUUID()
		if r != nvml.SUCCESS {
			return 0, false
		}
		for j, o := range s.GPUs {
			if o.Device.UUID == uuid {
				return j, true
			}
		}
		return 0, false
	}
	// links lists the remote end of each of GPU i's NVLinks: bridges first, then the switches.
	links := func() []string {
		t := s.topologyNow()
		var out []string
		for j := range s.GPUs {
			if n := t.Bridges[[2]int{min(i, j), max(i, j)}]; j != i && n > 0 {
				for range n {
					out = append(out, busID(j))
				}
			}
		}
		for range t.SwitchLinks {
			out = append(out, switchBus)
		}
		return out
	}
	deviceID := d.Config.PciDeviceId
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(busID(i), deviceID), nvml.SUCCESS }
	d.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		j, ok := index(peer)
		if !ok {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if j == i {
			return nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS
		}
		t := s.topologyNow()
		if t.PCIe == nil {
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
		return t.PCIe(min(i, j), max(i, j)), nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		ls := links()
		if len(ls) == 0 {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if l < 0 || l >= len(ls) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		ls := links()
		if l < 0 || l >= len(ls) {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return pciInfo(ls[l], 0), nvml.SUCCESS
	}
	d.GetP2PStatusFunc = func(peer nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		j, ok := index(peer)
		if !ok {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		t := s.topologyNow()
		if caps == nvml.P2P_CAPS_INDEX_NVLINK && (t.SwitchLinks > 0 || t.Bridges[[2]int{min(i, j), max(i, j)}] > 0) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
	}
}
