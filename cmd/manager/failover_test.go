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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// Leader election timing of the test's replicas: short, so the takeover is quick, with the same ratios
// as the defaults (renew deadline below the lease, several retries per lease).
const (
	testLease = 4 * time.Second
	testRenew = 3 * time.Second
	testRetry = 500 * time.Millisecond
)

// TestLeaderFailoverMidRollout runs two manager processes with leader election against the real API
// server, SIGKILLs the leader while a disruptive change rolls out within maxUnavailable, and checks that
// the other replica takes over within the lease (plus the polls in which it notices), that the
// rollout finishes, that a watch never sees more than maxUnavailable nodes with an unapplied change, and
// that no GPU's applied sharing changes more than once.
func TestLeaderFailoverMidRollout(t *testing.T) {
	const nodes, limit = 40, 4
	env := testenv.StartForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := env.Client
	var names []string
	for i := range nodes {
		name := fmt.Sprintf("fo-%02d", i)
		names = append(names, name)
		if err := c.Create(ctx, b.Node(name, "pool", "fo")); err != nil {
			t.Fatal(err)
		}
		gn := b.GPUNode(name)
		if err := c.Create(ctx, gn); err != nil {
			t.Fatal(err)
		}
		gn.Status.GPUs = []v1.GPUStatus{b.GPU(name, 0, b.WithApplied(b.Exclusive(), "")), b.GPU(name, 1, b.WithApplied(b.Exclusive(), ""))}
		gn.Status.GPUCount = 2
		if err := c.Status().Update(ctx, gn); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "manager")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the manager: %v\n%s", err, out)
	}
	kubeconfig, err := env.AdminKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := startReplica(t, bin, kubeconfig, dir, "a")
	waitLeading(t, first, 60*time.Second)
	second := startReplica(t, bin, kubeconfig, dir, "b")

	// The watch plays the agents (each change acked 100ms after it is seen) and counts what a pod would
	// feel: nodes with an unapplied change at once, and changes of each GPU's applied sharing.
	w, err := watchGPUNodes(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu          sync.Mutex
		maxInFlight int
		applies     = map[string]int{}
		appliedHash = map[string]string{}
		acked       = map[string]bool{}
		latest      = map[string]*v1.GPUNode{}
		scheduled   = map[string]int64{}
		watching    = true
	)
	want := b.MIG("3g.40gb", 2)
	wantHash := v1.SharingHash(want)
	go func() {
		defer func() { mu.Lock(); watching = false; mu.Unlock() }()
		for ev := range w.ResultChan() {
			gn, ok := ev.Object.(*v1.GPUNode)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			mu.Lock()
			latest[gn.Name] = gn
			inFlight := 0
			for _, g := range latest {
				if pending(g) {
					inFlight++
				}
			}
			maxInFlight = max(maxInFlight, inFlight)
			done := len(gn.Status.GPUs) > 0
			for _, g := range gn.Status.GPUs {
				key := gn.Name + "/" + g.UUID
				h := ""
				if g.Applied != nil {
					h = g.Applied.SpecHash
				}
				if old, seen := appliedHash[key]; seen && old != h {
					applies[key]++
				}
				appliedHash[key] = h
				done = done && h == wantHash
			}
			acked[gn.Name] = done
			if pending(gn) && scheduled[gn.Name] != gn.Generation {
				scheduled[gn.Name] = gn.Generation
				name := gn.Name
				time.AfterFunc(100*time.Millisecond, func() { _ = agentsim.Ack(ctx, c, name, nil) })
			}
			mu.Unlock()
		}
	}()
	count := func() (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, ok := range acked {
			if ok {
				n++
			}
		}
		return n
	}

	p := b.Policy("fo", b.WithNodeLabels("pool", "fo"), b.WithSharing(want), b.WithMaxUnavailable(intstr.FromInt32(limit)))
	p.Generation = 0
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 2*time.Minute, func() (bool, string) {
		return count() >= nodes/3, fmt.Sprintf("%d acked", count())
	}, "a third of the nodes acked")
	killedWith := count()
	if killedWith == nodes {
		t.Fatal("the rollout finished before the leader was killed; the test checks nothing")
	}
	first.kill(t)
	killed := time.Now()
	// The lease runs out from the last renewal the follower saw; client-go's candidates poll every retry
	// period stretched by up to 2.2x (JitterFactor 1.2), once to see that renewal and once to find the
	// lease expired; a second more for a loaded machine.
	bound := testLease + 2*testRetry*22/10 + time.Second
	waitLeading(t, second, 2*bound)
	if took := time.Since(killed); took > bound {
		t.Errorf("the other replica took over %s after the SIGKILL, want within %s (lease %s and the retries that notice it)", took, bound, testLease)
	} else {
		t.Logf("leader SIGKILLed with %d of %d nodes acked; the other replica led %s later", killedWith, nodes, took.Round(10*time.Millisecond))
	}

	wait.UntilState(t, 2*time.Minute, func() (bool, string) {
		got := &v1.GPUSharingPolicy{}
		if err := c.Get(ctx, client.ObjectKey{Name: "fo"}, got); err != nil {
			t.Fatal(err)
		}
		return got.Status.ObservedGeneration == got.Generation && meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady) &&
			got.Status.ReadyGPUs == 2*nodes && count() == nodes, fmt.Sprintf("%d of %d nodes acked, status %+v", count(), nodes, got.Status)
	}, "the rollout finished after the failover")
	mu.Lock()
	defer mu.Unlock()
	if !watching {
		t.Fatal("the API server ended the watch early; the counts are blind")
	}
	w.Stop()
	if maxInFlight > limit {
		t.Errorf("saw %d nodes with an unapplied change at once, maxUnavailable is %d", maxInFlight, limit)
	}
	if maxInFlight == 0 {
		t.Error("the watch never saw a change in flight; it watched nothing")
	}
	for _, n := range names {
		for i := range 2 {
			key := n + "/" + b.UUID(n, int32(i))
			if applies[key] != 1 {
				t.Errorf("GPU %s changed its applied sharing %d times, want once", key, applies[key])
			}
		}
	}
}

// pending says whether a node lists a sharing its agent has not reported applied.
func pending(gn *v1.GPUNode) bool {
	for i := range gn.Spec.GPUs {
		e := &gn.Spec.GPUs[i]
		ok := false
		for _, g := range gn.Status.GPUs {
			ok = ok || (g.UUID == e.UUID && g.Applied != nil && g.Applied.SpecHash == v1.SharingHash(e.Sharing))
		}
		if !ok {
			return true
		}
	}
	return false
}

func watchGPUNodes(ctx context.Context, env *testenv.Env) (watch.Interface, error) {
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	return wc.Watch(ctx, &v1.GPUNodeList{})
}

type replica struct {
	cmd     *exec.Cmd
	metrics string
	exited  chan struct{}
}

func startReplica(t *testing.T, bin, kubeconfig, dir, name string) *replica {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	logs, err := os.Create(filepath.Join(dir, "replica-"+name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{metrics: "http://" + addr + "/metrics", exited: make(chan struct{})}
	// Plain HTTP on loopback: the test reads each replica's leader gauge itself, without a token.
	r.cmd = exec.Command(bin, "--kubeconfig", kubeconfig, "--metrics-bind-address", addr, "--metrics-secure=false", "--health-probe-bind-address", "0",
		"--leader-elect", "--leader-election-namespace", "default",
		"--leader-election-lease-duration", testLease.String(), "--leader-election-renew-deadline", testRenew.String(),
		"--leader-election-retry-period", testRetry.String(), "--kube-api-qps", "200", "--kube-api-burst", "400")
	r.cmd.Stdout, r.cmd.Stderr = logs, logs
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a test binary killed by -timeout
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.exited
		_ = logs.Close()
		if t.Failed() {
			if out, err := os.ReadFile(logs.Name()); err == nil {
				t.Logf("replica %s log (tail):\n%s", name, tail(string(out), 3000))
			}
		}
	})
	return r
}

func (r *replica) kill(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.exited
}

// waitLeading waits for the replica's leader_election_master_status gauge to read 1.
func waitLeading(t *testing.T, r *replica, timeout time.Duration) {
	t.Helper()
	wait.Until(t, timeout, func() bool { return leading(r.metrics) }, "replica %s leads", r.metrics)
}

func leading(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if line := s.Text(); strings.HasPrefix(line, "leader_election_master_status{") && strings.HasSuffix(line, " 1") {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
