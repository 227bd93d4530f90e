package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// manager is the real cmd/manager binary running as a child process, so its memory and CPU are its own.
type manager struct {
	binary  string
	cmd     *exec.Cmd
	metrics string
	pprof   string
	dir     string
	exited  chan struct{}
}

// started lists every replica, so an interrupted benchmark stops them all.
var started struct {
	sync.Mutex
	all []*manager
}

func stopAll() {
	started.Lock()
	defer started.Unlock()
	for _, m := range started.all {
		m.stop()
	}
}

// managerBuild is cmd/manager built once per benchmark, with the kubeconfig every replica uses.
type managerBuild struct {
	dir, binary, kubeconfig string
}

func buildManager(ctx context.Context, env *testenv.Env) (*managerBuild, error) {
	dir, err := os.MkdirTemp("", "gpusharing-bench-")
	if err != nil {
		return nil, err
	}
	mb := &managerBuild{dir: dir, binary: filepath.Join(dir, "manager")}
	build := exec.CommandContext(ctx, "go", "build", "-o", mb.binary, "./cmd/manager")
	build.Dir, build.Stdout, build.Stderr = env.RepoRoot, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("building cmd/manager: %w", err)
	}
	if mb.kubeconfig, err = env.AdminKubeconfig(dir); err != nil {
		return nil, err
	}
	return mb, nil
}

func (mb *managerBuild) remove() { _ = os.RemoveAll(mb.dir) }

// start runs one manager replica named name (its log file) with the benchmark's settings and extra flags.
func (mb *managerBuild) start(o options, name string, extra ...string) (*manager, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	m := &manager{binary: mb.binary, dir: mb.dir, exited: make(chan struct{})}
	m.metrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	logPath := filepath.Join(mb.dir, name+".log")
	if o.managerLog != "" {
		logPath = o.managerLog + "." + name
	}
	logs, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig", mb.kubeconfig,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", port),
		// Plain HTTP on loopback: the benchmark reads the manager's series itself, without a token.
		"--metrics-secure=false",
		"--health-probe-bind-address", "0",
		"--kube-api-qps", strconv.FormatFloat(o.qps, 'f', -1, 64),
		"--kube-api-burst", strconv.Itoa(o.burst),
		"--resolver-workers", strconv.Itoa(o.resolverWorkers),
		"--resolver-min-workers", strconv.Itoa(o.resolverMinWorkers),
		"--write-latency-target", o.writeLatencyTarget.String(),
		"-v", strconv.Itoa(o.managerV),
	}
	if o.pprof {
		pport, err := freePort()
		if err != nil {
			return nil, err
		}
		m.pprof = fmt.Sprintf("127.0.0.1:%d", pport)
		args = append(args, "--pprof-bind-address", m.pprof)
	}
	m.cmd = exec.Command(m.binary, append(args, extra...)...)
	m.cmd.Stdout, m.cmd.Stderr = logs, logs
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the manager: %w", err)
	}
	go func() { _ = m.cmd.Wait(); close(m.exited) }()
	started.Lock()
	started.all = append(started.all, m)
	started.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(m.metrics); err == nil {
			_ = resp.Body.Close()
			return m, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.stop()
	return nil, fmt.Errorf("the manager did not serve metrics within 60s; see %s", logs.Name())
}

func (m *manager) pid() int { return m.cmd.Process.Pid }

func (m *manager) stop() {
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(30 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	}
}

// kill ends the manager with SIGKILL: no lease release, no graceful shutdown.
func (m *manager) kill() {
	_ = m.cmd.Process.Kill()
	<-m.exited
}

// rss and peakRSS read VmRSS and VmHWM (KiB) of the manager process; -1 when unreadable.
func (m *manager) rss() int64     { return procStatus(m.pid(), "VmRSS:") }
func (m *manager) peakRSS() int64 { return procStatus(m.pid(), "VmHWM:") }

// cpu is the manager's user+system CPU time so far, from /proc/<pid>/stat (clock ticks of 1/100 s).
func (m *manager) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.pid()))
	if err != nil {
		return -1
	}
	// The command name (field 2) may hold spaces; the fields after its closing parenthesis are fixed.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func procStatus(pid int, key string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) >= 2 && fields[0] == key {
			v, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return -1
			}
			return v
		}
	}
	return -1
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitIdle waits until a freshly started manager has resolved every node once and its queues stayed
// empty for a second: only then does a timed step start, so the start-up pass is not in it.
func (m *manager) waitIdle(nodes int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last, quietSince := -1.0, time.Now()
	for time.Now().Before(deadline) {
		n, depth, err := activity(m.metrics)
		if err == nil {
			if n != last || depth > 0 {
				last, quietSince = n, time.Now()
			} else if n >= float64(nodes) && time.Since(quietSince) > time.Second {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the manager did not settle within %s", timeout)
}
