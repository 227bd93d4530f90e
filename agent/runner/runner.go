// Package runner runs host commands (nvidia-smi, nvidia-cuda-mps-control) for the agent. Every command
// goes through the Runner interface so tests can point the agent at fake executables and record exactly
// what it ran, and so no command can hang a reconcile pass: each has a context and a timeout.
package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// DefaultTimeout bounds a command that names no timeout of its own.
const DefaultTimeout = 30 * time.Second

// Cmd is one host command.
type Cmd struct {
	// Path is the executable, absolute or resolved by the caller.
	Path string
	// Args are the arguments, without the program name.
	Args []string
	// Env is added to the agent's own environment (KEY=VALUE); later entries win.
	Env []string
	// Stdin is fed to the command; empty means no input.
	Stdin string
	// Timeout bounds the run; zero means DefaultTimeout.
	Timeout time.Duration
}

// String renders the command for logs and condition messages.
func (c Cmd) String() string {
	s := strings.TrimSpace(c.Path + " " + strings.Join(c.Args, " "))
	if c.Stdin != "" {
		s = fmt.Sprintf("echo %q | %s", strings.TrimSpace(c.Stdin), s)
	}
	return s
}

// Result is what a finished command left behind.
type Result struct {
	Stdout   string
	Stderr   string
	ExitCode int
}

// Runner runs host commands.
type Runner interface {
	// Run runs cmd to completion. A command that ran and exited non-zero returns its Result and an
	// *ExitError; a command that could not start or timed out returns an error that is not one.
	Run(ctx context.Context, cmd Cmd) (Result, error)
}

// ExitError is a command that ran and exited non-zero; it carries the output for condition messages.
type ExitError struct {
	Cmd    Cmd
	Result Result
}

func (e *ExitError) Error() string {
	out := strings.TrimSpace(e.Result.Stderr)
	if out == "" {
		out = strings.TrimSpace(e.Result.Stdout)
	}
	return fmt.Sprintf("%s: exit code %d: %s", e.Cmd, e.Result.ExitCode, out)
}

// ErrTimeout is returned (wrapped) when a command outlives its timeout.
var ErrTimeout = errors.New("command timed out")

// Exec runs commands as child processes of the agent.
type Exec struct{}

// LookPath finds an executable in $PATH, for main's discovery of host tools: path lookup stays beside
// the one place that runs commands.
func LookPath(name string) (string, error) { return exec.LookPath(name) }

var _ Runner = Exec{}

// Run implements Runner.
func (Exec) Run(ctx context.Context, c Cmd) (Result, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	if c.Stdin != "" {
		cmd.Stdin = strings.NewReader(c.Stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A daemonizing command (nvidia-cuda-mps-control -d) leaves a child holding our pipes open; without
	// WaitDelay, Wait would block until that daemon exits.
	cmd.WaitDelay = time.Second

	err := cmd.Run()
	res := Result{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: cmd.ProcessState.ExitCode()}
	if ctx.Err() == context.DeadlineExceeded {
		return res, fmt.Errorf("%s: %w after %s", c, ErrTimeout, timeout)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return res, &ExitError{Cmd: c, Result: res}
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		// The command itself exited cleanly; only a daemon it left behind kept the pipes.
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w", c, err)
	}
	return res, nil
}
