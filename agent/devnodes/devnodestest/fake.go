// Package devnodestest makes NVIDIA device nodes for machines without a GPU: real character devices
// with the driver's numbers, and the proc files that list them, under one directory. Unit tests read
// them through devnodes.Host; the real-node e2e hands them to containers through the container runtime.
// Making a node needs CAP_MKNOD (root).
package devnodestest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/devnodes"
)

// The majors the fake driver registers for unified memory and MIG capabilities; a real driver takes
// free ones at load time, so nothing may assume these.
const (
	UVMMajor  = 508
	CapsMajor = 509
)

// Driver's layout of mig-minors: config and monitor first, then per GPU 15 GPU instances of one access
// file each followed by 8 compute instances.
const (
	gisPerGPU = 15
	cisPerGI  = 8
	perGI     = 1 + cisPerGI
	perGPU    = gisPerGPU * perGI
	firstGPU  = 3
)

// MIGMinor is the capability minor the driver gives gpu<gpu>/gi<gi>/access (ci < 0) or
// gpu<gpu>/gi<gi>/ci<ci>/access.
func MIGMinor(gpu, gi, ci int) uint32 {
	m := firstGPU + gpu*perGPU + gi*perGI
	if ci >= 0 {
		m += 1 + ci
	}
	return uint32(m)
}

// Make creates, under root, dev/ with /dev/nvidia0..gpus-1 (195:i), nvidiactl (195:255), nvidia-uvm and
// nvidia-uvm-tools (UVMMajor:0 and 1) and every MIG capability node of those GPUs (CapsMajor), and proc/
// with devices and driver/nvidia-caps/mig-minors listing them, as the driver does. It returns the Host
// that reads them. Existing nodes are replaced.
func Make(root string, gpus int) (devnodes.Host, error) {
	h := devnodes.Host{Dev: filepath.Join(root, "dev"), Proc: filepath.Join(root, "proc")}
	for _, d := range []string{filepath.Join(h.Dev, "nvidia-caps"), filepath.Join(h.Proc, "driver", "nvidia-caps")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return h, err
		}
	}
	mk := func(name string, major, minor uint32) error {
		p := filepath.Join(h.Dev, name)
		_ = os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		// mknod's mode is masked by the umask.
		return os.Chmod(p, 0o666)
	}
	for i := 0; i < gpus; i++ {
		if err := mk(fmt.Sprintf("nvidia%d", i), devnodes.NvidiaMajor, uint32(i)); err != nil {
			return h, err
		}
	}
	if err := mk("nvidiactl", devnodes.NvidiaMajor, devnodes.ControlMinor); err != nil {
		return h, err
	}
	if err := mk("nvidia-uvm", UVMMajor, 0); err != nil {
		return h, err
	}
	if err := mk("nvidia-uvm-tools", UVMMajor, 1); err != nil {
		return h, err
	}
	var minors strings.Builder
	minors.WriteString("config 1\nmonitor 2\n")
	for g := 0; g < gpus; g++ {
		for gi := 0; gi < gisPerGPU; gi++ {
			for ci := -1; ci < cisPerGI; ci++ {
				name := fmt.Sprintf("gpu%d/gi%d/access", g, gi)
				if ci >= 0 {
					name = fmt.Sprintf("gpu%d/gi%d/ci%d/access", g, gi, ci)
				}
				m := MIGMinor(g, gi, ci)
				fmt.Fprintf(&minors, "%s %d\n", name, m)
				if err := mk(fmt.Sprintf("nvidia-caps/nvidia-cap%d", m), CapsMajor, m); err != nil {
					return h, err
				}
			}
		}
	}
	devices := fmt.Sprintf("Character devices:\n  1 mem\n%d nvidia-frontend\n%d nvidia-uvm\n%d nvidia-caps\n\nBlock devices:\n  7 loop\n",
		devnodes.NvidiaMajor, UVMMajor, CapsMajor)
	if err := os.WriteFile(filepath.Join(h.Proc, "devices"), []byte(devices), 0o644); err != nil {
		return h, err
	}
	return h, os.WriteFile(filepath.Join(h.Proc, "driver", "nvidia-caps", "mig-minors"), []byte(minors.String()), 0o644)
}
