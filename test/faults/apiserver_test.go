package faults

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/scheduler"
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// outage is how long the API server is away, each time.
const outage = 30 * time.Second

// sharedResource is the device plugin's resource of a shim-shared GPU.
const sharedResource = "gpusharing.io/gpu-shared"

// apiServer finds the test's kube-apiserver process (envtest does not expose it) by its secure port.
func apiServer(t *testing.T, env *testenv.Env) (int, []string) {
	t.Helper()
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	want := "--secure-port=" + u.Port()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil || len(raw) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "kube-apiserver" {
			continue
		}
		for _, a := range argv[1:] {
			if a == want {
				var pid int
				if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err != nil {
					t.Fatal(err)
				}
				return pid, argv
			}
		}
	}
	t.Fatalf("no kube-apiserver with %s", want)
	return 0, nil
}

// shimClient is a shim as the scheduler sees it: HELLO, then ACQUIRE until GRANT.
type shimClient struct {
	conn net.Conn
}

// lockFromScheduler connects to the GPU's scheduler socket and takes the lock, all within timeout;
// the connection stays open (a client of the GPU) until the test ends.
func lockFromScheduler(t *testing.T, sock string, timeout time.Duration) error {
	t.Helper()
	conn, err := net.DialTimeout("unix", sock, timeout)
	if err != nil {
		return err
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(timeout))
	c := &shimClient{conn: conn}
	if err := c.send(scheduler.Message{Type: scheduler.MsgHello, PID: uint32(os.Getpid()), Priority: scheduler.ClassOpportunistic}); err != nil {
		return err
	}
	if _, err := c.expect(scheduler.MsgWelcome); err != nil {
		return err
	}
	if err := c.send(scheduler.Message{Type: scheduler.MsgAcquire}); err != nil {
		return err
	}
	g, err := c.expect(scheduler.MsgGrant)
	if err != nil {
		return err
	}
	if err := c.send(scheduler.Message{Type: scheduler.MsgRelease, Epoch: g.Epoch}); err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Time{})
	return nil
}

func (c *shimClient) send(m scheduler.Message) error {
	raw, err := scheduler.Encode(m)
	if err != nil {
		return err
	}
	_, err = c.conn.Write(raw)
	return err
}

func (c *shimClient) expect(typ scheduler.MsgType) (scheduler.Message, error) {
	for {
		m, err := scheduler.ReadMessage(c.conn)
		if err != nil {
			return m, fmt.Errorf("waiting for %v: %w", typ, err)
		}
		if m.Type == typ {
			return m, nil
		}
	}
}

// stillServing checks, while the API server is away, that both processes run and that the agent serves
// its node: the device plugin lists and allocates the GPU's shares to the kubelet, and the GPU's shim
// servesThroughTheOutage checks serving halfway through the outage that began at start and at its end.
func servesThroughTheOutage(t *testing.T, start time.Time, check func()) {
	t.Helper()
	time.Sleep(outage / 2)
	check()
	time.Sleep(time.Until(start.Add(outage)))
	check()
}

// scheduler grants its lock to a new client.
func stillServing(t *testing.T, kubelet *fakekubelet.Kubelet, sock string, procs ...*proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	plugin, err := kubelet.Dial(sharedResource)
	if err != nil {
		t.Fatalf("dialing the device plugin during the outage: %v", err)
	}
	defer plugin.Close()
	w, err := plugin.Watch(ctx)
	if err != nil {
		t.Fatalf("ListAndWatch during the outage: %v", err)
	}
	devs, err := w.Next(ctx)
	if err != nil || len(devs) == 0 {
		t.Fatalf("ListAndWatch during the outage listed %v: %v", fakekubelet.Health(devs), err)
	}
	if _, err := plugin.AllocateOne(ctx, devs[0].ID); err != nil {
		t.Fatalf("Allocate during the outage: %v", err)
	}
	if err := lockFromScheduler(t, sock, 5*time.Second); err != nil {
		t.Fatalf("the shim scheduler during the outage: %v", err)
	}
	for _, p := range procs {
		if !p.alive() {
			t.Fatalf("%s exited during the API server outage: %v", p.name, p.err)
		}
	}
}

// shimClients counts the clients of our pid the agent published for GPU 0.
func shimClients(ctx context.Context, c client.Client, node string) (int, error) {
	gn := &v1.GPUNode{}
	if err := c.Get(ctx, client.ObjectKey{Name: node}, gn); err != nil {
		return 0, err
	}
	n := 0
	for _, g := range gn.Status.GPUs {
		if g.Applied == nil || g.Applied.Shim == nil {
			continue
		}
		for _, cl := range g.Applied.Shim.Clients {
			if cl.PID == int32(os.Getpid()) {
				n++
			}
		}
	}
	return n, nil
}

// TestAPIServerAwayForThirtySecondsTwice runs the real manager (leader election on, its default timing)
// and the real agent (device plugin through a fake kubelet, a shim-shared simulated GPU) and takes the API
// server away for 30 s twice: frozen (SIGSTOP: connections hang rather than fail), then killed and
// started again on the same port over the same etcd. Throughout, neither process exits, the device plugin
// lists and allocates, and the shim scheduler grants a new client its lock. After each outage the agent
// publishes what it saw meanwhile (the clients that connected), and a policy change made after the second
// converges, with the GPU reconfigured once.
func TestAPIServerAwayForThirtySecondsTwice(t *testing.T) {
	agent, manager := binaries(t)
	env := testenv.StartForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	kubeconfig, err := env.AdminKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	short, err := os.MkdirTemp("", "ha")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	kubelet, err := fakekubelet.Start(short)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)
	shimLib := filepath.Join(dir, "libgpushare.so")
	if err := os.WriteFile(shimLib, []byte("stand-in"), 0o644); err != nil {
		t.Fatal(err)
	}

	const node = "outage"
	if err := env.Client.Create(ctx, b.Node(node, "pool", "outage")); err != nil {
		t.Fatal(err)
	}
	shared := v1.Sharing{Strategy: v1.StrategyExclusive, Oversubscription: &v1.Oversubscription{}}
	policy := b.Policy("outage", b.WithNodeLabels("pool", "outage"), b.WithSharing(shared))
	policy.Generation = 0
	if err := env.Client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "gpus.json")
	hostRoot := filepath.Join(short, "host")
	ag := start(t, dir, "agent", []string{"KUBECONFIG=" + kubeconfig}, agentArgs(agent, node, hostRoot, state,
		"--device-plugin-dir="+short, "--pod-resources-socket=", "--shim-library="+shimLib)...)
	mgr := start(t, dir, "manager", nil, manager, "--kubeconfig", kubeconfig, "--metrics-bind-address", "0",
		"--health-probe-bind-address", "0", "--leader-elect", "--leader-election-namespace", "default", "--status-debounce=50ms")
	wait.UntilOK(t, 90*time.Second, func() (bool, error) {
		return appliedAsDesired(ctx, env.Client, node)
	}, "the shim-shared policy applied")
	sock := filepath.Join(hostRoot, "scheduler", gpu0, "gpushare.sock")
	stillServing(t, kubelet, sock, ag, mgr)
	wait.UntilOK(t, 30*time.Second, func() (bool, error) {
		n, err := shimClients(ctx, env.Client, node)
		return n == 1, err
	}, "the first client published")

	// Frozen: every request the processes send hangs.
	pid, argv := apiServer(t, env)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	servesThroughTheOutage(t, time.Now(), func() { stillServing(t, kubelet, sock, ag, mgr) })
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// Published at the agent's next resync (1 s); the bound is slack for a loaded machine (the time taken
	// is logged), not the property checked.
	wait.UntilOK(t, 30*time.Second, func() (bool, error) {
		n, err := shimClients(ctx, env.Client, node)
		return n == 3, err
	}, "the clients of the freeze published")
	t.Logf("after the freeze: the agent published the 2 clients that connected during it %s after SIGCONT", time.Since(back).Round(10*time.Millisecond))

	// Killed, and started again 30 s later on the same port over the same etcd.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	servesThroughTheOutage(t, killed, func() { stillServing(t, kubelet, sock, ag, mgr) })
	restarted := exec.Command(argv[0], argv[1:]...)
	var apiLog bytes.Buffer
	restarted.Stdout, restarted.Stderr = &apiLog, &apiLog
	restarted.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // as testenv's: dies with the test binary
	if err := restarted.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Before envtest stops etcd (cleanups run last first). SIGKILL: a graceful stop would wait on the
		// agent's and the manager's watches, and nothing it holds needs saving.
		_ = restarted.Process.Kill()
		_ = restarted.Wait()
	})
	wait.UntilOK(t, 60*time.Second, func() (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &v1.GPUNode{})
		return err == nil, err
	}, "the API server back")
	t.Logf("the API server answered again %s after it was killed", time.Since(killed).Round(10*time.Millisecond))
	back = time.Now()
	wait.UntilOK(t, 30*time.Second, func() (bool, error) {
		n, err := shimClients(ctx, env.Client, node)
		return n == 5, err
	}, "the clients of the kill published")
	t.Logf("after the kill: the agent published the 2 clients that connected during it %s after the API server answered", time.Since(back).Round(10*time.Millisecond))
	for _, p := range []*proc{ag, mgr} {
		if !p.alive() {
			t.Fatalf("%s exited after the outages: %v", p.name, p.err)
		}
	}

	// A change made after the outages converges, and the GPU is reconfigured once. Not at once: the
	// manager's and the agent's reflectors retried their watches through the outage on client-go's
	// backoff, which reaches [30, 60) s, and the last failed try can fall just before the API server
	// answered, so either process may first see the change up to 60 s after back (one run: the spec
	// still unwritten 60 s after the change). Both waits end 90 s after back; the agent's has at least
	// 15 s after the spec lands (its watch is back by then: the apply itself takes a second).
	reconnected := back.Add(90 * time.Second)
	changed := time.Now()
	testenv.Update(t, ctx, env.Client, policy, func(p *v1.GPUSharingPolicy) { p.Spec.Sharing = b.MIG("3g.40gb", 2) })
	wait.UntilOK(t, time.Until(reconnected), func() (bool, error) {
		gn := &v1.GPUNode{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, gn); err != nil {
			return false, err
		}
		return len(gn.Spec.GPUs) == 1 && gn.Spec.GPUs[0].Sharing.Strategy == v1.StrategyMIG, fmt.Errorf("spec %+v", gn.Spec.GPUs)
	}, "the manager writing the MIG policy into the GPUNode")
	resolved := time.Since(changed)
	wait.UntilOK(t, max(time.Until(reconnected), 15*time.Second), func() (bool, error) {
		return appliedAsDesired(ctx, env.Client, node)
	}, "the agent applying the MIG policy")
	t.Logf("a policy change after the outages: in the GPUNode's spec after %s, applied after %s", resolved.Round(10*time.Millisecond), time.Since(changed).Round(10*time.Millisecond))
	checkLayoutMadeOnce(t, state, 2)
	for _, p := range []*proc{ag, mgr} {
		if !p.alive() {
			t.Fatalf("%s exited: %v", p.name, p.err)
		}
	}
	if t.Failed() {
		t.Logf("restarted kube-apiserver log (tail):\n%s", tail(apiLog.String(), 3000))
	}
}
