package gpu

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TopologyReader reads how the node's GPUs are connected to each other. It is apart from Interface
// because only the device plugin's preferred allocation reads it; *NVML and Null implement it.
type TopologyReader interface {
	// Topology reads the links between every pair of whole GPUs.
	Topology(ctx context.Context) (Topology, error)
}

// PCIeLevel is the closest PCIe ancestor two GPUs share, as NVML's GpuTopologyLevel ranks it: the
// lower, the closer (nvidia-smi topo -m prints PIX, PXB, PHB, NODE, SYS).
type PCIeLevel int

// PCIe levels, NVML's values.
const (
	PCIeBoard      PCIeLevel = PCIeLevel(nvml.TOPOLOGY_INTERNAL)   // both on one board (a dual-GPU card)
	PCIeSwitch     PCIeLevel = PCIeLevel(nvml.TOPOLOGY_SINGLE)     // PIX: one PCIe switch
	PCIeSwitches   PCIeLevel = PCIeLevel(nvml.TOPOLOGY_MULTIPLE)   // PXB: several PCIe switches, no host bridge
	PCIeHostBridge PCIeLevel = PCIeLevel(nvml.TOPOLOGY_HOSTBRIDGE) // PHB: one host bridge
	PCIeNode       PCIeLevel = PCIeLevel(nvml.TOPOLOGY_NODE)       // NODE: host bridges of one NUMA node
	PCIeSystem     PCIeLevel = PCIeLevel(nvml.TOPOLOGY_SYSTEM)     // SYS: across NUMA nodes (the CPU interconnect)
)

// Link is how two GPUs reach each other.
type Link struct {
	// NVLinks is how many NVLinks join them, directly (bridges) or through NVSwitches (the fewer of
	// the two GPUs' active links); 0 where peer traffic goes over PCIe.
	NVLinks int
	// PCIe is their closest common PCIe ancestor.
	PCIe PCIeLevel
}

// Closer reports whether l is a faster path than o: more NVLinks first, then a closer PCIe ancestor.
func (l Link) Closer(o Link) bool {
	if l.NVLinks != o.NVLinks {
		return l.NVLinks > o.NVLinks
	}
	return l.PCIe < o.PCIe
}

// Topology is the links between pairs of GPUs, by uuid.
type Topology struct {
	links map[[2]string]Link
}

// SetLink records the link between a and b (either order).
func (t *Topology) SetLink(a, b string, l Link) {
	if t.links == nil {
		t.links = map[[2]string]Link{}
	}
	t.links[pair(a, b)] = l
}

// Between is the link between a and b; ok is false when the topology does not know the pair.
func (t Topology) Between(a, b string) (Link, bool) {
	l, ok := t.links[pair(a, b)]
	return l, ok
}

// Empty reports whether the topology knows no pair (one GPU, or nothing read).
func (t Topology) Empty() bool { return len(t.links) == 0 }

func pair(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Topology implements TopologyReader. A GPU or link NVML cannot describe (no NVLink on the board, a
// driver that cannot tell the PCIe path) reads as the farthest: a choice made without it is the choice
// made without topology, never a failure.
func (n *NVML) Topology(ctx context.Context) (Topology, error) {
	var t Topology
	count, r := n.lib.DeviceGetCount()
	if err := check("DeviceGetCount", r); err != nil {
		return t, err
	}
	type gpuInfo struct {
		h     nvml.Device
		uuid  string
		bus   string
		links []string // the remote PCI bus id of each active NVLink
	}
	gpus := make([]gpuInfo, 0, count)
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return t, err
		}
		h, r := n.lib.DeviceGetHandleByIndex(i)
		if err := check(fmt.Sprintf("DeviceGetHandleByIndex(%d)", i), r); err != nil {
			return t, err
		}
		uuid, r := h.GetUUID()
		if err := check("GetUUID", r); err != nil {
			return t, err
		}
		g := gpuInfo{h: h, uuid: uuid}
		if pci, r := h.GetPciInfo(); r == nvml.SUCCESS {
			g.bus = busID(pci)
		}
		g.links = activeNVLinks(h)
		gpus = append(gpus, g)
	}
	for i := range gpus {
		for j := i + 1; j < len(gpus); j++ {
			a, b := gpus[i], gpus[j]
			l := Link{PCIe: PCIeSystem}
			if level, r := a.h.GetTopologyCommonAncestor(b.h); r == nvml.SUCCESS {
				l.PCIe = PCIeLevel(level)
			}
			for _, remote := range a.links {
				if remote != "" && remote == b.bus {
					l.NVLinks++
				}
			}
			if l.NVLinks == 0 && len(a.links) > 0 && len(b.links) > 0 {
				// No bridge between them: through NVSwitches when NVML says peer traffic takes NVLink.
				if s, r := a.h.GetP2PStatus(b.h, nvml.P2P_CAPS_INDEX_NVLINK); r == nvml.SUCCESS && s == nvml.P2P_STATUS_OK {
					l.NVLinks = min(len(a.links), len(b.links))
				}
			}
			t.SetLink(a.uuid, b.uuid, l)
		}
	}
	return t, nil
}

// activeNVLinks lists the remote PCI bus id of each of the GPU's active NVLinks ("" where NVML does
// not say); nil for a GPU without NVLink.
func activeNVLinks(h nvml.Device) []string {
	var out []string
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, r := h.GetNvLinkState(l)
		if r == nvml.ERROR_INVALID_ARGUMENT || r == nvml.ERROR_NOT_SUPPORTED {
			// Past the GPU's last link, or no NVLink at all.
			break
		}
		if r != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		remote := ""
		if pci, r := h.GetNvLinkRemotePciInfo(l); r == nvml.SUCCESS {
			remote = busID(pci)
		}
		out = append(out, remote)
	}
	return out
}

// busID is the PCI bus id NVML writes as a C string.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// Topology implements TopologyReader: a node without NVML knows no links.
func (n Null) Topology(context.Context) (Topology, error) { return Topology{}, n.err() }
