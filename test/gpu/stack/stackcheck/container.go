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
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
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

// passedThrough are the host variables a workload keeps besides its edits': what the image would set
// (PATH, HOME) and the driver libraries' path the NVIDIA runtime provides, plus the machine's own rules.
var passedThrough = []string{"PATH", "HOME", "LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"}

// edits are what the container runtime applies to a container for its devices: environment variables,
// bind mounts and device nodes (checked, not applied: cdi.go). The device plugin's Allocate answer and a
// CDI device's containerEdits both come to this.
type edits struct {
	env         map[string]string
	mounts      []bindMount
	deviceNodes []string
}

// bindMount is one host path bind-mounted into the container, with CDI's mount options.
type bindMount struct {
	host, container string
	options         []string
}

// editsOfAllocate are the edits of the device plugin's answer for one container.
func editsOfAllocate(resp *pluginapi.ContainerAllocateResponse) edits {
	e := edits{env: map[string]string{}}
	for k, v := range resp.Envs {
		e.env[k] = v
	}
	for _, m := range resp.Mounts {
		b := bindMount{host: m.HostPath, container: m.ContainerPath}
		if m.ReadOnly {
			b.options = []string{"ro"}
		}
		e.mounts = append(e.mounts, b)
	}
	return e
}

// startContainer runs argv with exactly the env and mounts of alloc (startWith).
func (s *stack) startContainer(name string, alloc *allocation, argv []string) (*container, error) {
	return s.startWith(name, editsOfAllocate(alloc.resp), argv)
}

// startWith runs argv with exactly the edits: in a mount namespace of its own, each host path is
// bind-mounted at its container path with its options, and the environment is the edits' plus
// passedThrough.
func (s *stack) startWith(name string, e edits, argv []string) (*container, error) {
	var script []string
	for _, m := range e.mounts {
		st, err := os.Stat(m.host)
		if err != nil {
			return nil, fmt.Errorf("mount %s -> %s: %w", m.host, m.container, err)
		}
		lines, err := mountScript(m)
		if err != nil {
			return nil, err
		}
		if err := s.mountPoint(m.container, st.IsDir()); err != nil {
			return nil, err
		}
		script = append(script, lines...)
	}
	env := []string{}
	for _, k := range passedThrough {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	keys := make([]string, 0, len(e.env))
	for k := range e.env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+e.env[k])
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

// mountScript is the shell that mounts m inside the container's namespace: a bind (recursive with
// rbind, as runtimes do), then a remount for the flags among its options. An option the runtime would
// apply and this cannot is an error, so no edit is silently left out.
func mountScript(m bindMount) ([]string, error) {
	bind := "--bind"
	var flags []string
	for _, o := range m.options {
		switch o {
		case "rbind":
			bind = "--rbind"
		case "bind", "rw":
		case "ro", "nosuid", "nodev", "noexec":
			flags = append(flags, o)
		default:
			return nil, fmt.Errorf("mount %s -> %s: option %q not supported here", m.host, m.container, o)
		}
	}
	lines := []string{fmt.Sprintf("mount %s %s %s", bind, shQuote(m.host), shQuote(m.container))}
	if len(flags) > 0 {
		lines = append(lines, fmt.Sprintf("mount -o remount,bind,%s %s", strings.Join(flags, ","), shQuote(m.container)))
	}
	return lines, nil
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
