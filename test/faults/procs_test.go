// Package faults kills and stops the real processes (the agent, the manager, kube-apiserver) at the worst
// moments and checks what the next process, or the same one afterwards, makes of it. The agent runs over
// simulated GPUs whose state outlives it (--simulate-gpus-state), as real hardware outlives a killed agent,
// and whose journal counts every mutation all agent processes made.
package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// gpu0 is the first simulated GPU's uuid (nvmlmock.NewNode, sequence 0).
const gpu0 = "GPU-00000000-0000-4000-8000-000000000000"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the agent and the manager from this tree once per test binary.
func binaries(t *testing.T) (agent, manager string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "faults-bin")
		if buildErr != nil {
			return
		}
		root := testenv.RepoRoot()
		for _, name := range []string{"agent", "manager"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, name), "./cmd/"+name)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("building %s: %v\n%s", name, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "agent"), filepath.Join(binDir, "manager")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// proc is one process a test started; its output goes to a log file shown when the test fails.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error
}

func start(t *testing.T, dir, name string, env []string, argv ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logs, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, log: logPath, exited: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = logs, logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a test binary killed by -timeout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); _ = logs.Close(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			if out, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s log (tail):\n%s", name, tail(string(out), 4000))
			}
		}
	})
	return p
}

// kill SIGKILLs the process and waits for it.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
}

// alive says whether the process still runs.
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// agentArgs are the flags every test's agent runs with: simulated H100s with persistent state, a fast
// resync, no metrics or probe port to collide on.
func agentArgs(bin, node, hostRoot, state string, extra ...string) []string {
	return append([]string{bin, "--node-name=" + node, "--host-root=" + hostRoot,
		"--simulate-gpus=H100:1", "--simulate-gpus-state=" + state,
		"--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:0", "--health-checks=false",
		"--resync=1s", "-v=2",
		// The simulated GPUs have no device nodes on this machine: shares carry the environment only.
		"--device-nodes=false"}, extra...)
}

// appliedAsDesired says whether the agent reports every listed GPU running its desired sharing for the
// GPUNode's current generation.
func appliedAsDesired(ctx context.Context, c client.Client, name string) (bool, error) {
	gn := &v1.GPUNode{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, gn); err != nil {
		return false, err
	}
	cond := meta.FindStatusCondition(gn.Status.Conditions, v1.ConditionApplied)
	if cond == nil || gn.Status.ObservedGeneration != gn.Generation {
		return false, fmt.Errorf("observed generation %d of %d, Applied %+v", gn.Status.ObservedGeneration, gn.Generation, cond)
	}
	return cond.Status == "True" && cond.Reason == v1.ReasonAsDesired, fmt.Errorf("Applied %s %s: %s", cond.Status, cond.Reason, cond.Message)
}

// journal reads the simulated GPUs' journal: every mutation every agent process made, in order.
func journal(t *testing.T, state string) []string {
	t.Helper()
	f, err := os.Open(nvmlmock.JournalPath(state))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		out = append(out, strings.TrimPrefix(s.Text(), gpu0+" "))
	}
	return out
}

// hardware reads the simulated GPUs' state file.
func hardware(t *testing.T, state string) nvmlmock.PersistedState {
	t.Helper()
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var st nvmlmock.PersistedState
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// countCalls counts the journal lines that start with each prefix.
func countCalls(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// checkLayoutMadeOnce checks that the journal holds exactly one MIG mode change, one create per instance
// of the layout, one compute instance per GPU instance created, and no destroy; and that the hardware
// holds those instances, each with its compute instance.
func checkLayoutMadeOnce(t *testing.T, state string, instances int) {
	t.Helper()
	failedBefore := t.Failed()
	lines := journal(t, state)
	if n := countCalls(lines, "SetMigMode(1)"); n != 1 {
		t.Errorf("MIG mode was enabled %d times, want once", n)
	}
	if n := countCalls(lines, "CreateGpuInstance"); n != instances {
		t.Errorf("%d GPU instances were created, want %d (one per instance of the layout)", n, instances)
	}
	if n := countCalls(lines, "Destroy"); n != 0 {
		t.Errorf("%d instances were destroyed, want none", n)
	}
	ciPerGI := map[string]int{}
	for _, l := range lines {
		if strings.HasPrefix(l, "CreateComputeInstance(GI ") {
			ciPerGI[strings.TrimSuffix(strings.Fields(l)[1], ")")]++
		}
	}
	if len(ciPerGI) != instances {
		t.Errorf("compute instances were created in %d GPU instances, want %d", len(ciPerGI), instances)
	}
	for gi, n := range ciPerGI {
		if n != 1 {
			t.Errorf("GPU instance %s got %d compute instances, want 1", gi, n)
		}
	}
	hw := hardware(t, state)
	if len(hw.GPUs) != 1 || len(hw.GPUs[0].Instances) != instances {
		t.Fatalf("the hardware holds %+v, want %d instances", hw.GPUs, instances)
	}
	for _, gi := range hw.GPUs[0].Instances {
		if len(gi.CIs) != 1 {
			t.Errorf("GPU instance %d has %d compute instances, want 1", gi.ID, len(gi.CIs))
		}
	}
	if t.Failed() && !failedBefore {
		t.Logf("journal:\n%s", strings.Join(lines, "\n"))
	}
}
