package procfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// writeTasks lays out <root>/<pid>/task/<tid>/stat with each thread in the given state.
func writeTasks(t *testing.T, root, pid string, states map[string]string) {
	t.Helper()
	for tid, st := range states {
		dir := filepath.Join(root, pid, "task", tid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(tid+" (py (w) 1) "+st+" 1 2 3 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStoppedNeedsEveryLiveThreadStopped(t *testing.T) {
	root := t.TempDir()
	writeTasks(t, root, "10", map[string]string{"10": "T", "11": "t"})
	writeTasks(t, root, "20", map[string]string{"20": "T", "21": "S"})
	writeTasks(t, root, "30", map[string]string{"30": "Z", "31": "T"})
	writeTasks(t, root, "40", map[string]string{"40": "Z"})
	for _, tt := range []struct {
		pid  int
		want bool
	}{{10, true}, {20, false}, {30, true}, {40, false}} {
		if got, err := Stopped(root, tt.pid); err != nil || got != tt.want {
			t.Errorf("Stopped(%d) = %v, %v; want %v", tt.pid, got, err, tt.want)
		}
	}
	if _, err := Stopped(root, 50); !os.IsNotExist(err) {
		t.Errorf("a missing process: %v, want not-exist", err)
	}
}

// A real process: running, then stopped by SIGSTOP, then running again after SIGCONT.
func TestStoppedFollowsARealProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	state := func(want bool) func() (bool, string) {
		return func() (bool, string) {
			got, err := Stopped("/proc", pid)
			return err == nil && got == want, fmt.Sprintf("Stopped = %v, %v", got, err)
		}
	}
	wait.UntilState(t, 10*time.Second, state(false), "the sleeping process not stopped")
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 10*time.Second, state(true), "the process stopped after SIGSTOP")
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 10*time.Second, state(false), "the process running again after SIGCONT")
}
