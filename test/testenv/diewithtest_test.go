package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// helperEnv makes the test binary a stand-in for a test process: it starts "etcd" the way envtest does
// (through dyingBinDir's links; here the real etcd is sleep), prints the pid, and waits to be killed.
const helperEnv = "GPUSHARING_TESTENV_HELPER_BIN"

func TestMain(m *testing.M) {
	if bin := os.Getenv(helperEnv); bin != "" {
		os.Exit(standInTestProcess(bin))
	}
	os.Exit(m.Run())
}

func standInTestProcess(bin string) int {
	dir, err := dyingBinDir(bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command(filepath.Join(dir, "etcd"), "600")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	select {} // until killed
}

// A test process killed outright (as by go test's -timeout) takes the control plane it started with it.
func TestTheControlPlaneDiesWithTheTestProcess(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	bin := t.TempDir()
	if err := os.Symlink(sleep, filepath.Join(bin, "etcd")); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parent := exec.Command(self)
	parent.Env = append(os.Environ(), helperEnv+"="+bin)
	parent.Stderr = os.Stderr
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the stand-in test process printed no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// It runs the real binary (sleep) by now, or soon: the link execs it after the parent-death request.
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return err == nil && filepath.Base(exe) == "sleep", fmt.Sprintf("exe %q (%v)", exe, err)
	}, "the control plane's stand-in runs the real binary")

	if err := parent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true, "" // gone and reaped
		}
		// "pid (comm) state ...": a zombie (Z) is dead, waiting for init to reap it.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		return len(fields) > 0 && fields[0] == "Z", "state " + fields[0]
	}, "process %d, started by the killed test process, is dead", pid)
}
