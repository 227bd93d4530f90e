package procfs

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// Frozen reports whether process pid under root is frozen by a cgroup freezer (a container paused by its
// runtime, a checkpoint in progress): its threads then sleep in the kernel, so Stopped does not see them,
// yet none of them runs, the shim's thread neither.
//
// The process's cgroups are read as it sees them, through its own root (<root>/<pid>/root/sys/fs/cgroup):
// a container runtime mounts the container's cgroup there as the cgroup file system's root, so this
// needs no path translation between the agent's cgroup namespace and the container's, and no mount of
// the host's cgroup tree into the agent. cgroup v2: the root's cgroup.events says "frozen 1" (set too
// when an ancestor, the pod's cgroup, is frozen); v1: freezer/freezer.state says FROZEN (likewise).
// FREEZING (v1, some threads not frozen yet) is not frozen. A process whose root shows the host's
// cgroup root (no container) is never frozen here: the root cgroup cannot be frozen, and a host
// process's own sub-cgroup is not looked for. A missing process is an error that os.IsNotExist
// recognizes; a file that is not there is not frozen.
func Frozen(root string, pid int) (bool, error) {
	proc := filepath.Join(root, strconv.Itoa(pid))
	if _, err := os.Lstat(proc); err != nil {
		return false, err
	}
	cg := filepath.Join(proc, "root", "sys", "fs", "cgroup")
	if b, err := os.ReadFile(filepath.Join(cg, "cgroup.events")); err == nil {
		for line := range bytes.Lines(b) {
			if f := bytes.Fields(line); len(f) == 2 && string(f[0]) == "frozen" {
				return string(f[1]) == "1", nil
			}
		}
		return false, nil
	}
	if b, err := os.ReadFile(filepath.Join(cg, "freezer", "freezer.state")); err == nil {
		return string(bytes.TrimSpace(b)) == "FROZEN", nil
	}
	return false, nil
}
