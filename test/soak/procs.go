package soak

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpusharing/gpusharing/test/freezer"
)

// replyTimeout bounds one command of a client: a client that does not answer within it is hung, which
// the soak reports (a shim that blocks its process for good).
const replyTimeout = 20 * time.Second

// proc is one running soak_client (shim/tests/soak_client.c): a process of a pod.
type proc struct {
	pod     *pod
	cmd     *exec.Cmd
	in      io.WriteCloser
	lines   chan string
	pid     int32
	dropped bool // it exec'd itself without the shim
	// ctx holds the devices it has a context on.
	ctx map[int]bool

	// cg is the cgroup it runs in as a one-process container (nil: none, where this machine cannot
	// make one): a stall may freeze it there, as a runtime pauses a container.
	cg *freezer.Cgroup

	mu      sync.Mutex
	stopped bool // SIGSTOPped or frozen: it answers nothing until its stall ends
	cont    *time.Timer
}

func (pr *proc) isStopped() bool { pr.mu.Lock(); defer pr.mu.Unlock(); return pr.stopped }

// stall stops the process for d (SIGSTOP, then SIGCONT and then), as a process the machine does not run,
// or with freeze freezes its cgroup for d (then thaws it), as a runtime pauses a container; false if it is
// stalled already.
func (pr *proc) stall(d time.Duration, freeze bool, then func()) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stopped {
		return false
	}
	stop, cont := func() { pr.signal(syscall.SIGSTOP) }, func() { pr.signal(syscall.SIGCONT) }
	if freeze {
		stop, cont = func() { _ = pr.cg.Freeze() }, func() { _ = pr.cg.Thaw() }
	}
	stop()
	pr.stopped = true
	pr.cont = time.AfterFunc(d, func() {
		pr.mu.Lock()
		again := pr.stopped
		if again {
			cont()
			pr.stopped = false
		}
		pr.mu.Unlock()
		if again {
			then()
		}
	})
	return true
}

// start runs a client of p with env (the shim, the stub driver and the pod's settings) and the shim
// preloaded, in a cgroup of its own where cgroups is set (freezer.Make's v2; nil: none, and no error
// where the machine cannot make one).
func start(shimBuild string, p *pod, env []string, cgroups bool) (*proc, error) {
	argv, preload := []string{filepath.Join(shimBuild, "tests", "soak_client")}, filepath.Join(shimBuild, "libgpushare.so")
	var cg *freezer.Cgroup
	if cgroups {
		c, err := freezer.Make("v2")
		if err != nil && !errors.Is(err, freezer.ErrUnavailable) {
			return nil, err
		}
		cg = c
	}
	if cg != nil {
		argv = cg.Wrap(preload, argv...)
	} else {
		env = append(env, "LD_PRELOAD="+preload)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	// A soak that is itself killed leaves no client behind, stopped ones included.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pr := &proc{pod: p, cmd: cmd, in: in, lines: make(chan string, 16), pid: int32(cmd.Process.Pid), ctx: map[int]bool{}, cg: cg}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			pr.lines <- sc.Text()
		}
		close(pr.lines)
	}()
	return pr, nil
}

// do sends one command and waits for its answer; "" and an error when the process ended or hung.
func (pr *proc) do(format string, args ...any) (string, error) {
	line := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(pr.in, line); err != nil {
		return "", fmt.Errorf("pid %d: %q: %w", pr.pid, line, err)
	}
	select {
	case r, ok := <-pr.lines:
		if !ok {
			return "", fmt.Errorf("pid %d ended during %q", pr.pid, line)
		}
		return r, nil
	case <-time.After(replyTimeout):
		return "", fmt.Errorf("pid %d: no answer to %q within %s (hung)", pr.pid, line, replyTimeout)
	}
}

// ok says whether a reply reports success (r=0).
func ok(reply string) bool { return strings.HasSuffix(reply, " r=0") }

// kill ends the process with SIGKILL (which ends a frozen process too, on cgroup v2) and reaps it.
func (pr *proc) kill() {
	pr.mu.Lock()
	if pr.cont != nil {
		pr.cont.Stop()
	}
	pr.stopped = false
	_ = pr.cmd.Process.Signal(syscall.SIGKILL)
	pr.mu.Unlock()
	_ = pr.cmd.Wait()
}

// exit asks the process to end and reaps it; one that does not end in time is killed.
func (pr *proc) exit() {
	if _, err := pr.do("exit"); err != nil {
		pr.kill()
		return
	}
	_ = pr.in.Close()
	done := make(chan struct{})
	go func() { _ = pr.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(replyTimeout):
		pr.kill()
	}
}

func (pr *proc) signal(s syscall.Signal) { _ = pr.cmd.Process.Signal(s) }

// holdFile is where the stub driver writes what pid holds (GPUSHARE_STUB_HOLD_DIR).
func holdFile(dir string, pid int32) string { return filepath.Join(dir, fmt.Sprint(pid)) }

// forget removes a reaped process's holdings: NVML lists no process that has ended.
func forget(dir string, pid int32) { _ = os.Remove(holdFile(dir, pid)) }
