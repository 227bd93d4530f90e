// Package freezer gives tests a real cgroup freezer laid out as a container runtime lays out a
// container's: a cgroup of its own, mounted in the process's own mount namespace as the root of its
// cgroup file system, so that what the agent reads through /proc/<pid>/root is what it reads of a paused
// container. cgroup v1's freezer controller and cgroup v2's cgroup.freeze are both real kernel freezers;
// a machine of this project has both (a v1 hybrid with v2 at /sys/fs/cgroup/unified) or v2 alone.
package freezer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Versions are the freezers Make knows.
var Versions = []string{"v1", "v2"}

// ErrUnavailable: this machine cannot give the freezer (not root, or no such hierarchy).
var ErrUnavailable = errors.New("no cgroup freezer to make")

// Cgroup is one frozen-or-thawed cgroup.
type Cgroup struct {
	Dir string // the cgroup on the host
	// MountAt is where a runtime mounts the container's cgroup in the container, and State the file
	// there (and in Dir) that says whether it is frozen.
	MountAt, State string

	control, on, off, frozen string
}

// Make makes a cgroup in the version's hierarchy; ErrUnavailable where it cannot.
func Make(version string) (*Cgroup, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: not root", ErrUnavailable)
	}
	c := &Cgroup{}
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
		return nil, fmt.Errorf("unknown freezer %q", version)
	}
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		return nil, fmt.Errorf("%w: no cgroup %s hierarchy at %s", ErrUnavailable, version, parent)
	}
	dir, err := os.MkdirTemp(parent, "gs-freezer-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	c.Dir = dir
	if _, err := os.Stat(filepath.Join(dir, c.control)); err != nil { // a kernel without this freezer
		_ = os.Remove(dir)
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return c, nil
}

// New is Make for a test: it skips the test where the machine cannot give the freezer, and removes the
// cgroup when the test ends (its processes must have ended by then: cleanups run last registered first,
// so a process started after New is killed before).
func New(t testing.TB, version string) *Cgroup {
	t.Helper()
	c, err := Make(version)
	if errors.Is(err, ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Error(err)
		}
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

// Freeze asks the kernel to freeze the cgroup; it returns at once (the kernel freezes each process as it
// can, as a runtime's pause does).
func (c *Cgroup) Freeze() error { return c.set(c.on) }

// Frozen: the kernel says every process of the cgroup is frozen.
func (c *Cgroup) Frozen() bool {
	b, _ := os.ReadFile(filepath.Join(c.Dir, c.State))
	return strings.Contains(string(b), c.frozen)
}

// FreezeAndWait freezes the cgroup and waits until the kernel says it is frozen, failing the test
// otherwise.
func (c *Cgroup) FreezeAndWait(t testing.TB) {
	t.Helper()
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, c.Frozen, "the kernel's freezer done in %s", c.Dir)
}

// Thaw lets the cgroup's processes run again.
func (c *Cgroup) Thaw() error { return c.set(c.off) }

// Remove thaws and removes the cgroup once its processes are gone (the kernel may take a moment to see
// the last one out); removing it twice is no error.
func (c *Cgroup) Remove() error {
	if _, err := os.Stat(c.Dir); os.IsNotExist(err) {
		return nil
	}
	_ = c.Thaw()
	return wait.Poll(10*time.Second, func() error {
		if err := os.Remove(c.Dir); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	})
}

func (c *Cgroup) set(v string) error {
	return os.WriteFile(filepath.Join(c.Dir, c.control), []byte(v), 0o644)
}
