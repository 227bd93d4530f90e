package scheduler

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// startWithEnv starts a process that lives until the test ends with exactly env as its environment.
func startWithEnv(t *testing.T, env ...string) int32 {
	t.Helper()
	child := exec.Command("sleep", "60")
	child.Env = env
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	// Until the child has exec'd, its environ is the forking process's.
	cmdline := fmt.Sprintf("/proc/%d/cmdline", child.Process.Pid)
	wait.Until(t, 5*time.Second, func() bool {
		b, err := os.ReadFile(cmdline)
		return err == nil && strings.HasPrefix(string(b), "sleep\x00")
	}, "process %d runs sleep", child.Process.Pid)
	return int32(child.Process.Pid)
}

// A process started with GPUSHARE_GANG=off is in no gang, whatever its pod's key; others keep theirs.
func TestGangOptOutFromTheStartEnvironment(t *testing.T) {
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-0", SocketPath: "/nonexistent/0.sock"}},
		Guards: Guards{GangKey: func(int32) string { return "pod:x" }}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"GPUSHARE_GANG=off"}, ""},
		{[]string{"A=1", "GPUSHARE_GANG=0"}, ""},
		{[]string{"GPUSHARE_GANG=false"}, ""},
		{[]string{"GPUSHARE_GANG=on"}, "pod:x"},
		{[]string{"GPUSHARE_GANGS=off"}, "pod:x"},
		{nil, "pod:x"},
	} {
		if k := s.gangKey(startWithEnv(t, c.env...)); k != c.want {
			t.Errorf("gang key of a process started with %q = %q, want %q", c.env, k, c.want)
		}
	}
}
