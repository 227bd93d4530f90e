// Package freezer gives tests a real cgroup freezer laid out as a container runtime lays out a
// container's: a cgroup of its own, mounted in the process's own mount namespace as the root of its
// cgroup file system, so that what the agent reads through /proc/<pid>/root is what it reads of a paused
// container. cgroup v1's freezer controller and cgroup v2's cgroup.freeze are both real kernel freezers;
// a machine of this project has both (a v1 hybrid with v2 at /sys/fs/cgroup/unified) or v2 alone.
package freezer

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Versions are the freezers New knows.
var Versions = []string{"v1", "v2"}

// Cgroup is one test's frozen-or-thawed cgroup.
type Cgroup struct {
	t   testing.TB
	Dir string // the cgroup on the host
	// MountAt is where a runtime mounts the container's cgroup in the container, and State the file
	// there (and in Dir) that says whether it is frozen.
	MountAt, State string

	control, on, off, frozen string
}

// New makes a cgroup in the version's hierarchy and removes it when the test ends (its processes must
// have ended by then: the test's cleanups run first, last registered first). It skips the test where it
// cannot: not root, or no such hierarchy.
func New(t testing.TB, version string) *Cgroup {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	c := &Cgroup{t: t}
	var parent string
	switch version {
	case "v1":
		parent, c.MountAt, c.State, c.control, c.on, c.off, c.frozen =
			"/sys/fs/cgroup/freezer", "/sys/fs/cgroup/freezer", "freezer.state", "freezer.state", "FROZEN", "THAWED", "FROZEN"
	case "v2":
		parent, c.MountAt, c.State, c.control, c.on, c.off, c.frozen =
			"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "cgroup.events", "cgroup.freeze", "1", "0", "frozen 1"
		if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
			parent = "/sys/fs/cgroup" // cgroup v2 alone
		}
	default:
		t.Fatalf("unknown freezer %q", version)
	}
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		t.Skipf("no cgroup %s hierarchy at %s", version, parent)
	}
	dir, err := os.MkdirTemp(parent, "gs-freezer-test-")
	if err != nil {
		t.Skipf("cannot make a cgroup: %v", err)
	}
	c.Dir = dir
	t.Cleanup(func() {
		c.set(c.off)
		wait.Until(t, 10*time.Second, func() bool { return os.Remove(dir) == nil }, "the test's cgroup %s removed", dir)
	})
	return c
}

// Wrap is the command line that runs argv inside the cgroup as a container's process: it moves itself
// into the cgroup, mounts the cgroup where a runtime would in a mount namespace of its own, and execs
// argv with the environment variable LD_PRELOAD set to preload ("": none), so that a preloaded library
// loads into argv alone. The pid stays argv's.
func (c *Cgroup) Wrap(preload string, argv ...string) []string {
	return append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`d=$1 m=$2 p=$3; shift 3; echo $$ > "$d/cgroup.procs" && mount --bind "$d" "$m" && LD_PRELOAD=$p exec "$@"`,
		"sh", c.Dir, c.MountAt, preload}, argv...)
}

// Mounted: the process pid sees the cgroup mounted (Wrap's set-up is done).
func (c *Cgroup) Mounted(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root", c.MountAt, c.State))
	return err == nil
}

// Freeze freezes the cgroup and waits until the kernel says every process of it is frozen.
func (c *Cgroup) Freeze() {
	c.t.Helper()
	c.set(c.on)
	wait.UntilState(c.t, 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join(c.Dir, c.State))
		return strings.Contains(string(b), c.frozen), string(b)
	}, "the kernel's freezer done")
}

// Thaw lets the cgroup's processes run again.
func (c *Cgroup) Thaw() { c.t.Helper(); c.set(c.off) }

func (c *Cgroup) set(v string) {
	if err := os.WriteFile(filepath.Join(c.Dir, c.control), []byte(v), 0o644); err != nil {
		c.t.Errorf("%s: %v", c.control, err)
	}
}
