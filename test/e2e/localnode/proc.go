package localnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// proc is one long-running component, its output in <root>/logs/<name>.log.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func (n *Node) start(name, binary string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(filepath.Join(n.Root, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// containerd finds its shim and runc on PATH.
	cmd.Env = append(os.Environ(), "PATH="+n.Bin+":"+os.Getenv("PATH"))
	// Its own process group, so a stop reaches the children it started in the foreground.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(p.done) }()
	n.procs = append(n.procs, p)
	return p, nil
}

// stop sends SIGTERM to the process group and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitFor polls check until it succeeds, the process exits or the timeout passes.
func waitFor(ctx context.Context, what string, p *proc, timeout time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited before %s (see its log): %v", p.name, what, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s: %v", what, timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
