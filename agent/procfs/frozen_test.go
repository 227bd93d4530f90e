package procfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/freezer"
	"github.com/gpusharing/gpusharing/test/wait"
)

// writeCgroupFile lays out <root>/<pid>/root/sys/fs/cgroup/<rel> as a container runtime mounts it.
func writeCgroupFile(t *testing.T, root, pid, rel, content string) {
	t.Helper()
	p := filepath.Join(root, pid, "root", "sys", "fs", "cgroup", rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFrozenReadsTheContainersOwnCgroup(t *testing.T) {
	root := t.TempDir()
	writeCgroupFile(t, root, "10", "cgroup.events", "populated 1\nfrozen 1\n")
	writeCgroupFile(t, root, "11", "cgroup.events", "populated 1\nfrozen 0\n")
	writeCgroupFile(t, root, "20", "freezer/freezer.state", "FROZEN\n")
	writeCgroupFile(t, root, "21", "freezer/freezer.state", "FREEZING\n")
	writeCgroupFile(t, root, "22", "freezer/freezer.state", "THAWED\n")
	writeCgroupFile(t, root, "30", "cgroup.procs", "1\n") // the host's root cgroup: no freezer files
	for _, tt := range []struct {
		pid  int
		want bool
	}{{10, true}, {11, false}, {20, true}, {21, false}, {22, false}, {30, false}} {
		if got, err := Frozen(root, tt.pid); err != nil || got != tt.want {
			t.Errorf("Frozen(%d) = %v, %v; want %v", tt.pid, got, err, tt.want)
		}
	}
	if _, err := Frozen(root, 50); !os.IsNotExist(err) {
		t.Errorf("a missing process: %v, want not-exist", err)
	}
}

// A real process in a real cgroup laid out as a container's, frozen and thawed through the kernel's
// freezer (cgroup v1's controller and cgroup v2's cgroup.freeze). It sleeps in the kernel while frozen,
// so Stopped does not see it and Frozen must.
func TestFrozenFollowsARealFreezer(t *testing.T) {
	for _, v := range freezer.Versions {
		t.Run(v, func(t *testing.T) {
			cg := freezer.New(t, v)
			argv := cg.Wrap("", "sleep", "60")
			cmd := exec.Command(argv[0], argv[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			wait.UntilState(t, 10*time.Second, func() (bool, string) {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				return strings.TrimSpace(string(comm)) == "sleep" && cg.Mounted(pid), fmt.Sprintf("comm %q", comm)
			}, "the process asleep in its cgroup")
			state := func(want bool) func() (bool, string) {
				return func() (bool, string) {
					got, err := Frozen("/proc", pid)
					return err == nil && got == want, fmt.Sprintf("Frozen = %v, %v", got, err)
				}
			}
			wait.UntilState(t, 10*time.Second, state(false), "the running process not frozen")
			cg.FreezeAndWait(t)
			wait.UntilState(t, 10*time.Second, state(true), "the process frozen")
			if stopped, err := Stopped("/proc", pid); err != nil || stopped {
				t.Errorf("Stopped = %v, %v for a frozen process: its threads sleep, they are not stopped", stopped, err)
			}
			if err := cg.Thaw(); err != nil {
				t.Fatal(err)
			}
			wait.UntilState(t, 10*time.Second, state(false), "the process thawed")
		})
	}
}
