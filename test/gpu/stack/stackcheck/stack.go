package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// nodeName is the Node (and GPUNode) the agent runs as; policies select it by its label.
const (
	nodeName  = "gpu-stack-node"
	poolLabel = "gpusharing.io/test-pool"
	poolValue = "stack"
)

// stack is everything the run started, so teardown can stop it in reverse order.
type stack struct {
	o    options
	r    *report
	env  *testenv.Env
	c    client.Client
	kcfg string // admin kubeconfig, for kubectl and both components

	hostRoot, mpsRoot, schedRoot string
	// procRoot is the agent's --proc-root: this machine has no kubelet to put processes in pod cgroups,
	// so the per-pod usage scenario writes, for each of its processes, the cgroup file a kubelet's
	// container would have (usage.go).
	procRoot string
	smiCalls string // every call of the refusing nvidia-smi lands here
	kubelet  *fakekubelet.Kubelet
	podRes   *fakekubelet.PodResources
	pods     *podTable
	procs    []*exec.Cmd
	madeDirs []string // container mount points created on the host, removed at the end
	gpuUUID  string

	// draDir and cdiDir are the agent's --dra-plugin-dir (its kubelet plugin's socket dra.sock and
	// checkpoint) and --cdi-dir (the CDI specs of the claims it prepared).
	draDir, cdiDir string
}

func newStack(ctx context.Context, o options, r *report) (*stack, error) {
	if o.work == "" {
		// Short: <schedRoot>/<uuid>/gpushare.sock must fit a Unix socket path.
		w, err := os.MkdirTemp("/tmp", "gs-")
		if err != nil {
			return nil, err
		}
		o.work = w
	}
	if o.out == "" {
		o.out = filepath.Join(o.work, "out")
	}
	for _, p := range []*string{&o.repo, &o.assets, &o.bin, &o.shimLib, &o.work, &o.out} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, err
		}
		*p = abs
	}
	s := &stack{o: o, r: r, hostRoot: filepath.Join(o.work, "h")}
	s.mpsRoot, s.schedRoot = filepath.Join(s.hostRoot, "mps"), filepath.Join(s.hostRoot, "s")
	s.procRoot = filepath.Join(o.work, "proc")
	s.draDir, s.cdiDir = filepath.Join(o.work, "dra"), filepath.Join(o.work, "cdi")
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{filepath.Join(o.bin, "manager"), filepath.Join(o.bin, "agent"), filepath.Join(o.assets, "kubectl"), o.shimLib} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("missing %s (see test/gpu/stack/run.sh for what to build and carry): %w", f, err)
		}
	}

	env, err := testenv.StartAt(o.repo, o.assets)
	if err != nil {
		return nil, err
	}
	s.env, s.c = env, env.Client
	if s.kcfg, err = env.AdminKubeconfig(o.work); err != nil {
		return s, err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{poolLabel: poolValue}}}
	if err := s.c.Create(ctx, node); err != nil {
		return s, fmt.Errorf("creating the Node: %w", err)
	}
	dpDir := filepath.Join(o.work, "dp")
	if err := os.MkdirAll(dpDir, 0o755); err != nil {
		return s, err
	}
	if s.kubelet, err = fakekubelet.Start(dpDir); err != nil {
		return s, err
	}
	if s.podRes, err = fakekubelet.StartPodResources(filepath.Join(o.work, "podres.sock")); err != nil {
		return s, err
	}
	s.pods = &podTable{res: s.podRes}
	if err := s.startManager(); err != nil {
		return s, err
	}
	if err := s.startAgent(dpDir); err != nil {
		return s, err
	}
	return s, nil
}

// refusingSMI is the agent's nvidia-smi: the shared GPU machine's time-slice policy and compute mode must
// never change, so any call is refused and recorded (the run fails if one was made).
func (s *stack) refusingSMI() (string, error) {
	dir := filepath.Join(s.o.work, "fakebin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	s.smiCalls = filepath.Join(s.o.out, "nvidia-smi-calls.log")
	if err := os.WriteFile(s.smiCalls, nil, 0o644); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "nvidia-smi")
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %q\necho 'refused on the shared GPU machine' >&2\nexit 3\n", s.smiCalls)
	return path, os.WriteFile(path, []byte(script), 0o755)
}

func (s *stack) startManager() error {
	return s.start("manager", append([]string{filepath.Join(s.o.bin, "manager"),
		"--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:0", "--status-debounce=50ms"}, managerRightsizingFlags...))
}

// startAgent runs the agent as the DaemonSet does: in the machine's mount namespace, which is what the
// DaemonSet's Bidirectional MPS root amounts to. The agent itself mounts each MPS GPU's tmpfs at
// <mps-root>/<uuid>/shm and starts the daemon with it as /dev/shm (agent mps-launch), so MPS clients
// started with Allocate's mounts share memory with their daemon exactly as pods do. With --dra it also
// publishes ResourceSlices and serves the DRA kubelet plugin beside the device plugin, as the chart's
// deviceInterface Both does.
func (s *stack) startAgent(dpDir string) error {
	smi, err := s.refusingSMI()
	if err != nil {
		return err
	}
	agent := []string{filepath.Join(s.o.bin, "agent"),
		"--node-name=" + nodeName, "--host-root=" + s.hostRoot, "--mps-root=" + s.mpsRoot, "--scheduler-root=" + s.schedRoot,
		"--nvidia-smi=" + smi, "--device-plugin-dir=" + dpDir, "--pod-resources-socket=" + s.podRes.Path(),
		"--shim-library=" + s.o.shimLib, "--metrics-bind-address=" + agentMetrics, "--metrics-secure=false", "--health-probe-bind-address=127.0.0.1:0",
		"--proc-root=" + s.procRoot, "--accounting-interval=" + accountingInterval.String(),
		"--mps-shm-size=" + strconv.FormatInt(mpsShmSize, 10), "--resync=2s", "--drain-poll-interval=250ms",
		"--dra", "--dra-plugin-dir=" + s.draDir, "--dra-registry-dir=" + filepath.Join(s.o.work, "dra-registry"), "--cdi-dir=" + s.cdiDir, "-v=2"}
	return s.start("agent", agent)
}

// mpsShmSize is the agent's --mps-shm-size here (1 GiB), checked on the GPU's tmpfs.
const mpsShmSize = 1 << 30

// start runs a component with the admin kubeconfig, its output in <out>/<name>.log.
func (s *stack) start(name string, argv []string) error {
	logf, err := os.Create(filepath.Join(s.o.out, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.kcfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	s.procs = append(s.procs, cmd)
	return nil
}

// teardown stops everything in reverse order and quits every MPS daemon under the work directory, so
// nothing is left running on the shared machine.
func (s *stack) teardown() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	quitMPSDaemons(s.mpsRoot)
	// The agent unmounts a GPU's tmpfs when it leaves MPS; one left by a failed run must not stay mounted
	// on the shared machine.
	unmountUnder(s.mpsRoot)
	if s.podRes != nil {
		s.podRes.Stop()
	}
	if s.kubelet != nil {
		s.kubelet.Stop()
	}
	if s.env != nil {
		_ = s.env.Stop()
	}
	for i := len(s.madeDirs) - 1; i >= 0; i-- {
		_ = os.Remove(s.madeDirs[i])
	}
}

// kubectl runs the real kubectl against the API server.
func (s *stack) kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.o.assets, "kubectl"), append([]string{"--kubeconfig", s.kcfg}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// gpuNode reads the GPUNode and this run's GPU in its status (nil when not reported yet).
func (s *stack) gpuNode(ctx context.Context) (*v1alpha1.GPUNode, *v1alpha1.GPUStatus) {
	var n v1alpha1.GPUNode
	if err := s.c.Get(ctx, client.ObjectKey{Name: nodeName}, &n); err != nil {
		return nil, nil
	}
	for i := range n.Status.GPUs {
		if int(n.Status.GPUs[i].Index) == s.o.gpuIndex {
			return &n, &n.Status.GPUs[i]
		}
	}
	return &n, nil
}

// waitGPU polls this run's GPU status until cond holds, and returns how long that took.
func (s *stack) waitGPU(ctx context.Context, timeout time.Duration, cond func(*v1alpha1.GPUNode, *v1alpha1.GPUStatus) bool) (time.Duration, error) {
	start := time.Now()
	return waitFor(ctx, timeout, 20*time.Millisecond, func() bool {
		n, g := s.gpuNode(ctx)
		return g != nil && cond(n, g)
	}, start)
}

// policyReady says whether the policy's Ready condition is True for its current generation.
func (s *stack) policyReady(ctx context.Context, name string) bool {
	var p v1alpha1.GPUSharingPolicy
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		return false
	}
	if p.Status.ObservedGeneration != p.Generation {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func waitFor(ctx context.Context, timeout, every time.Duration, cond func() bool, start time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if cond() {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("not within %s", timeout)
		case <-time.After(every):
		}
	}
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func shJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shQuote(a)
	}
	return strings.Join(q, " ")
}
