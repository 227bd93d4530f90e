// Package devnodes reads the NVIDIA device nodes a container needs to reach one GPU or MIG instance, as
// the host has them: the GPU's /dev/nvidia<minor>, the control node /dev/nvidiactl, the unified memory
// nodes /dev/nvidia-uvm and /dev/nvidia-uvm-tools, and for a MIG instance the capability nodes of its
// GPU and compute instance (/dev/nvidia-caps/nvidia-cap<N>). A container that gets a share gets these
// nodes (CDI device nodes, the device plugin's Devices), so its GPU rests on what the runtime creates in
// its /dev and its device cgroup allows, not on an environment variable the pod could override.
//
// Every path is under two configurable roots: Dev, the host directory of the nodes (the agent reads
// them there and hands that path to the runtime), and Proc, the proc filesystem whose devices and
// driver/nvidia-caps/mig-minors files give the majors and the MIG capability minors.
package devnodes

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The NVIDIA driver's fixed numbers.
const (
	// NvidiaMajor is the major of /dev/nvidia<N> and /dev/nvidiactl (the driver registers 195).
	NvidiaMajor = 195
	// ControlMinor is /dev/nvidiactl's minor.
	ControlMinor = 255
	// UVMDriver and CapsDriver are the names /proc/devices lists the unified memory and MIG capability
	// majors under; the driver takes them dynamically.
	UVMDriver  = "nvidia-uvm"
	CapsDriver = "nvidia-caps"
	// ContainerDev is where a container sees the nodes: the same names under /dev as on the host.
	ContainerDev = "/dev"
)

// ErrMissing is returned when a node the container needs is not on the host, or is not the character
// device the driver makes (another type, another major or minor).
var ErrMissing = errors.New("NVIDIA device node missing")

// Node is one character device node a container gets.
type Node struct {
	// Path is the node's path in the container (/dev/nvidia0).
	Path string
	// HostPath is the node on the host, which the runtime creates the container's node from.
	HostPath string
	// Major and Minor are the node's numbers as the host has them.
	Major, Minor uint32
}

// Host reads the nodes under its roots.
type Host struct {
	// Dev is the host directory holding the nodes (/dev): the agent must see it at the same path.
	Dev string
	// Proc is the proc filesystem holding devices and driver/nvidia-caps/mig-minors (/proc).
	Proc string
}

// Defaults are a standard node's roots.
func Defaults() Host { return Host{Dev: "/dev", Proc: "/proc"} }

// GPU is the GPU's own node, /dev/nvidia<minor>.
func (h Host) GPU(minor int32) (Node, error) {
	if minor < 0 {
		return Node{}, fmt.Errorf("%w: the GPU's minor number is unknown (NVML did not report it)", ErrMissing)
	}
	return h.node("nvidia"+strconv.Itoa(int(minor)), NvidiaMajor, uint32(minor))
}

// Control is what every container with a GPU needs beside the GPU's own node: /dev/nvidiactl,
// /dev/nvidia-uvm and /dev/nvidia-uvm-tools (CUDA opens the unified memory node at initialization).
func (h Host) Control() ([]Node, error) {
	ctl, err := h.node("nvidiactl", NvidiaMajor, ControlMinor)
	if err != nil {
		return nil, err
	}
	majors, err := h.majors()
	if err != nil {
		return nil, err
	}
	uvm, ok := majors[UVMDriver]
	if !ok {
		return nil, fmt.Errorf("%w: %s lists no %s major (is the nvidia-uvm module loaded?)", ErrMissing, h.devicesFile(), UVMDriver)
	}
	out := []Node{ctl}
	for _, n := range []string{"nvidia-uvm", "nvidia-uvm-tools"} {
		node, err := h.nodeOfMajor(n, uvm)
		if err != nil {
			return nil, err
		}
		out = append(out, node)
	}
	return out, nil
}

// MIG are a MIG instance's capability nodes: the access files of its GPU instance and its compute
// instance on the GPU of the given minor, whose minors the driver lists in mig-minors.
func (h Host) MIG(gpuMinor, gi, ci int32) ([]Node, error) {
	if gpuMinor < 0 || gi < 0 || ci < 0 {
		return nil, fmt.Errorf("%w: the MIG instance's GPU minor, GPU instance or compute instance is unknown (%d, %d, %d)", ErrMissing, gpuMinor, gi, ci)
	}
	majors, err := h.majors()
	if err != nil {
		return nil, err
	}
	caps, ok := majors[CapsDriver]
	if !ok {
		return nil, fmt.Errorf("%w: %s lists no %s major", ErrMissing, h.devicesFile(), CapsDriver)
	}
	minors, err := h.migMinors()
	if err != nil {
		return nil, err
	}
	var out []Node
	for _, name := range []string{
		fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci),
	} {
		minor, ok := minors[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s lists no %s", ErrMissing, h.migMinorsFile(), name)
		}
		node, err := h.node(filepath.Join("nvidia-caps", "nvidia-cap"+strconv.Itoa(int(minor))), caps, minor)
		if err != nil {
			return nil, err
		}
		out = append(out, node)
	}
	return out, nil
}

// node stats <Dev>/<name> and checks that it is the character device major:minor.
func (h Host) node(name string, major, minor uint32) (Node, error) {
	n, err := h.stat(name)
	if err != nil {
		return n, err
	}
	if n.Major != major || n.Minor != minor {
		return n, fmt.Errorf("%w: %s is %d:%d, the driver's is %d:%d", ErrMissing, n.HostPath, n.Major, n.Minor, major, minor)
	}
	return n, nil
}

// nodeOfMajor stats <Dev>/<name> and checks its major; the driver picks the minor.
func (h Host) nodeOfMajor(name string, major uint32) (Node, error) {
	n, err := h.stat(name)
	if err != nil {
		return n, err
	}
	if n.Major != major {
		return n, fmt.Errorf("%w: %s has major %d, the driver's is %d", ErrMissing, n.HostPath, n.Major, major)
	}
	return n, nil
}

func (h Host) stat(name string) (Node, error) {
	n := Node{Path: filepath.Join(ContainerDev, name), HostPath: filepath.Join(h.Dev, name)}
	var st unix.Stat_t
	if err := unix.Stat(n.HostPath, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("%w: %s does not exist", ErrMissing, n.HostPath)
		}
		return n, fmt.Errorf("reading %s: %w", n.HostPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return n, fmt.Errorf("%w: %s is not a character device", ErrMissing, n.HostPath)
	}
	n.Major, n.Minor = unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
	return n, nil
}

func (h Host) devicesFile() string { return filepath.Join(h.Proc, "devices") }
func (h Host) migMinorsFile() string {
	return filepath.Join(h.Proc, "driver", "nvidia-caps", "mig-minors")
}

// majors reads the character devices section of /proc/devices: "<major> <name>" lines.
func (h Host) majors() (map[string]uint32, error) {
	out := map[string]uint32{}
	err := eachLine(h.devicesFile(), func(line string) bool {
		if strings.HasPrefix(line, "Block devices") {
			return false
		}
		if f := strings.Fields(line); len(f) == 2 {
			if m, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				out[f[1]] = uint32(m)
			}
		}
		return true
	})
	return out, err
}

// migMinors reads the driver's "<name> <minor>" lines, for example "gpu0/gi1/ci0/access 13".
func (h Host) migMinors() (map[string]uint32, error) {
	out := map[string]uint32{}
	err := eachLine(h.migMinorsFile(), func(line string) bool {
		if f := strings.Fields(line); len(f) == 2 {
			if m, err := strconv.ParseUint(f[1], 10, 32); err == nil {
				out[f[0]] = uint32(m)
			}
		}
		return true
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (the driver makes it where MIG is supported)", ErrMissing, h.migMinorsFile())
	}
	return out, err
}

func eachLine(path string, f func(string) bool) error {
	file, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer func() { _ = file.Close() }()
	s := bufio.NewScanner(file)
	for s.Scan() {
		if !f(s.Text()) {
			break
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}
