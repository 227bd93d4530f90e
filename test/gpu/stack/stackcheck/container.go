package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
)

// container is a workload started the way the container runtime would start it for an allocation.
type container struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   string // stdout file
	errf  string // stderr file
	done  chan struct{}
	err   error
}

// passedThrough are the host variables a workload keeps besides Allocate's: what the image would set
// (PATH, HOME) and the driver libraries' path the NVIDIA runtime provides, plus the machine's own rules.
var passedThrough = []string{"PATH", "HOME", "LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"}

// startContainer runs argv with exactly the env and mounts of alloc: in a mount namespace of its own,
// each host path is bind-mounted at its container path (read-only where Allocate says so), and the
// environment is Allocate's envs plus passedThrough.
func (s *stack) startContainer(name string, alloc *allocation, argv []string) (*container, error) {
	var script []string
	for _, m := range alloc.resp.Mounts {
		st, err := os.Stat(m.HostPath)
		if err != nil {
			return nil, fmt.Errorf("mount %s -> %s: %w", m.HostPath, m.ContainerPath, err)
		}
		if err := s.mountPoint(m.ContainerPath, st.IsDir()); err != nil {
			return nil, err
		}
		script = append(script, fmt.Sprintf("mount --bind %s %s", shQuote(m.HostPath), shQuote(m.ContainerPath)))
		if m.ReadOnly {
			script = append(script, fmt.Sprintf("mount -o remount,bind,ro %s", shQuote(m.ContainerPath)))
		}
	}
	env := []string{}
	for _, k := range passedThrough {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	keys := make([]string, 0, len(alloc.resp.Envs))
	for k := range alloc.resp.Envs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+alloc.resp.Envs[k])
	}
	script = append(script, "exec env -i "+shJoin(env)+" "+shJoin(argv))
	c := &container{out: filepath.Join(s.o.out, name+".out"), errf: filepath.Join(s.o.out, name+".err"), done: make(chan struct{})}
	stdout, err := os.Create(c.out)
	if err != nil {
		return nil, err
	}
	stderr, err := os.Create(c.errf)
	if err != nil {
		return nil, err
	}
	c.cmd = exec.Command("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", strings.Join(script, "\n"))
	c.cmd.Stdout, c.cmd.Stderr = stdout, stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		c.err = c.cmd.Wait()
		_ = stdout.Close()
		_ = stderr.Close()
		close(c.done)
	}()
	return c, nil
}

// pid is the workload's pid: unshare, sh and env each exec the next, so it is the one the GPU sees.
func (c *container) pid() int { return c.cmd.Process.Pid }

func (c *container) kill() {
	if c != nil && c.cmd.Process != nil {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// mountPoint creates a container path on the host where none exists (a file for a file mount),
// remembering it for teardown. The mount itself happens only inside the workload's namespace.
func (s *stack) mountPoint(path string, dir bool) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	var made []string
	for p := filepath.Dir(path); p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		made = append([]string{p}, made...)
	}
	target := filepath.Dir(path)
	if dir {
		target = path
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if !dir {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		_ = f.Close()
		made = append(made, path)
	} else {
		made = append(made, path)
	}
	s.madeDirs = append(s.madeDirs, made...)
	return nil
}

func resourceQty(n int) *resource.Quantity { return resource.NewQuantity(int64(n), resource.DecimalSI) }
