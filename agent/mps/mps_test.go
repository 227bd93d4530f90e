package mps

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakebin"
	"github.com/gpusharing/gpusharing/test/wait"
)

const gpuUUID = "GPU-0000aaaa-0000-0000-0000-000000000000"

type fixture struct {
	fake  *fakebin.Fake
	clock *clocktesting.FakeClock
	root  string
	m     *Manager
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	f := &fixture{fake: fakebin.MPSControl(t, dir), clock: clocktesting.NewFakeClock(time.Unix(1e9, 0)), root: filepath.Join(dir, "mps")}
	f.m = f.manager()
	return f
}

func (f *fixture) manager() *Manager {
	return New(Config{Control: f.fake.Path, Root: f.root, Runner: runner.Exec{}, Clock: f.clock, StartTimeout: 5 * time.Second})
}

// started runs the daemon with the test's settings and forgets the commands that took.
func (f *fixture) started(t *testing.T) Status {
	t.Helper()
	st, err := f.m.Ensure(context.Background(), gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	f.fake.Calls(t)
	return st
}

// env is what every command of the GPU carries, as the fake logs it.
func (f *fixture) env() string {
	return " CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(f.root, gpuUUID, "pipe") + " CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(f.root, gpuUUID, "log")
}

func (f *fixture) startCalls(s string) []string {
	calls := []string{"nvidia-cuda-mps-control -d" + f.env() + " CUDA_VISIBLE_DEVICES=" + gpuUUID}
	if s != "" {
		for _, c := range strings.Split(s, ";") {
			calls = append(calls, "nvidia-cuda-mps-control <<< "+c+f.env())
		}
	}
	return calls
}

var settings = Settings{ActiveThreadPercentage: 50, PinnedMemoryLimitMiB: 4096}

const settingsCalls = "set_default_active_thread_percentage 50;set_default_device_pinned_mem_limit 0 4096M"

func TestEnsureStartsTheDaemonWithItsSettingsAndASecondPassRunsNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st, err := f.m.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if st.State != StateRunning || st.PID == 0 || st.Settings != settings {
		t.Errorf("status = %+v, want Running with a pid and the settings", st)
	}
	if got, want := f.fake.Calls(t), f.startCalls(settingsCalls); !reflect.DeepEqual(got, want) {
		t.Errorf("commands =\n  %q\nwant\n  %q", got, want)
	}
	if _, err := f.m.Ensure(ctx, gpuUUID, settings); err != nil {
		t.Fatal(err)
	}
	if got := f.fake.Calls(t); len(got) != 0 {
		t.Errorf("second pass ran %q", got)
	}
}

func TestEnsureWithoutLimitsSendsNoSetCommands(t *testing.T) {
	f := newFixture(t)
	if _, err := f.m.Ensure(context.Background(), gpuUUID, Settings{}); err != nil {
		t.Fatal(err)
	}
	if got, want := f.fake.Calls(t), f.startCalls(""); !reflect.DeepEqual(got, want) {
		t.Errorf("commands = %q, want %q", got, want)
	}
}

func TestADeadDaemonIsRestartedWithExponentialBackoff(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st := f.started(t)
	for i, backoff := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitDead(t, st.PID)
		f.m.Check(ctx)
		if got, _ := f.m.Status(gpuUUID); got.State != StateRestarting {
			t.Fatalf("death %d: state = %s, want Restarting", i+1, got.State)
		}
		if ok, _ := f.m.Satisfied(gpuUUID, settings); ok {
			t.Errorf("death %d: a dead daemon counts as satisfied", i+1)
		}
		f.clock.Step(backoff - time.Millisecond)
		f.m.Check(ctx)
		if got := f.fake.Calls(t); len(got) != 0 {
			t.Fatalf("death %d: restarted before its %s backoff: %q", i+1, backoff, got)
		}
		f.clock.Step(time.Millisecond)
		f.m.Check(ctx)
		if got, want := f.fake.Calls(t), f.startCalls(settingsCalls); !reflect.DeepEqual(got, want) {
			t.Errorf("death %d: restart commands = %q, want %q", i+1, got, want)
		}
		st, _ = f.m.Status(gpuUUID)
		if st.State != StateRunning || st.Restarts != i+1 {
			t.Errorf("death %d: status = %+v, want Running with %d restarts", i+1, st, i+1)
		}
	}
}

func TestStopQuitsTheDaemonUnlessClientsAreConnected(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st := f.started(t)
	pipe := f.m.PipeDir(gpuUUID)
	write(t, filepath.Join(pipe, "servers"), "4100\n")
	write(t, filepath.Join(pipe, "clients.4100"), "5001\n5002\n")

	err := f.m.Stop(ctx, gpuUUID)
	if o, ok := outcome.As(err); !ok || o.Reason != v1alpha1.ReasonGPUBusy || !strings.Contains(o.Message, "2 MPS clients") {
		t.Fatalf("Stop with clients: err = %v, want GPUBusy naming 2 clients", err)
	}
	want := []string{"nvidia-cuda-mps-control <<< get_server_list" + f.env(), "nvidia-cuda-mps-control <<< get_client_list 4100" + f.env()}
	if got := f.fake.Calls(t); !reflect.DeepEqual(got, want) {
		t.Errorf("commands = %q, want %q", got, want)
	}

	if err := os.Remove(filepath.Join(pipe, "clients.4100")); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Stop(ctx, gpuUUID); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	want = append(want, "nvidia-cuda-mps-control <<< quit"+f.env())
	if got := f.fake.Calls(t); !reflect.DeepEqual(got, want) {
		t.Errorf("commands = %q, want %q", got, want)
	}
	if f.m.Running(gpuUUID) {
		t.Errorf("daemon %d still runs after Stop", st.PID)
	}
	if err := f.m.Stop(ctx, gpuUUID); err != nil || len(f.fake.Calls(t)) != 0 {
		t.Errorf("Stop without a daemon: err %v or commands ran", err)
	}
}

func TestARestartedAgentAdoptsTheRunningDaemon(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	first := f.started(t)
	restarted := f.manager()
	st, err := restarted.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != first.PID {
		t.Errorf("adopted pid %d, want the running daemon %d", st.PID, first.PID)
	}
	want := []string{
		"nvidia-cuda-mps-control <<< set_default_active_thread_percentage 50" + f.env(),
		"nvidia-cuda-mps-control <<< set_default_device_pinned_mem_limit 0 4096M" + f.env(),
	}
	if got := f.fake.Calls(t); !reflect.DeepEqual(got, want) {
		t.Errorf("commands = %q, want only the settings re-applied: %q", got, want)
	}
}

func TestNewSettingsRestartTheDaemon(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.started(t)
	if _, err := f.m.Ensure(ctx, gpuUUID, Settings{ActiveThreadPercentage: 25}); err != nil {
		t.Fatal(err)
	}
	want := append([]string{
		"nvidia-cuda-mps-control <<< get_server_list" + f.env(),
		"nvidia-cuda-mps-control <<< quit" + f.env(),
	}, f.startCalls("set_default_active_thread_percentage 25")...)
	if got := f.fake.Calls(t); !reflect.DeepEqual(got, want) {
		t.Errorf("commands =\n  %q\nwant\n  %q", got, want)
	}
}

func TestADaemonThatCannotStartReportsMPSDaemonFailed(t *testing.T) {
	dir := t.TempDir()
	fake := fakebin.Write(t, dir, "nvidia-cuda-mps-control", `echo "An instance of this daemon is already running" >&2; exit 1`)
	m := New(Config{Control: fake.Path, Root: filepath.Join(dir, "mps"), Runner: runner.Exec{}, Clock: clocktesting.NewFakeClock(time.Unix(1e9, 0))})
	st, err := m.Ensure(context.Background(), gpuUUID, settings)
	o, ok := outcome.As(err)
	if !ok || o.Reason != v1alpha1.ReasonMPSDaemonFailed || !strings.Contains(o.Message, "already running") {
		t.Fatalf("err = %v, want MPSDaemonFailed with the daemon's output", err)
	}
	if st.State != StateFailed {
		t.Errorf("state = %s, want Failed", st.State)
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitDead waits until a killed process is gone (or a zombie), as the kernel takes a moment.
func waitDead(t *testing.T, pid int) {
	t.Helper()
	m := New(Config{})
	wait.Until(t, 5*time.Second, func() bool {
		alive, _ := m.alive(pid)
		return !alive
	}, "process %d is gone", pid)
}

func TestAPassThatFindsTheDaemonDeadRestartsItAtOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st := f.started(t)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitDead(t, st.PID)
	st2, err := f.m.Ensure(ctx, gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	if st2.PID == st.PID || st2.Restarts != 1 || st2.State != StateRunning {
		t.Errorf("status = %+v, want a new Running daemon with 1 restart", st2)
	}
	if got, want := f.fake.Calls(t), f.startCalls(settingsCalls); !reflect.DeepEqual(got, want) {
		t.Errorf("commands = %q, want %q", got, want)
	}
}

// The pipe directory is a pod's to write: a pod that points the daemon's pid file at another live process
// must not make a restarted agent adopt that process (it would report a dead daemon running and never
// restart it). The agent adopts what it recorded when it started the daemon.
func TestAPodRewritingThePidFileCannotPointTheAgentElsewhere(t *testing.T) {
	f := newFixture(t)
	first := f.started(t)
	// Some other live process (not the test's own: the fake's quit and the cleanup kill what the file names).
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	forged := filepath.Join(f.root, gpuUUID, "pipe", PIDFile)
	if err := os.WriteFile(forged, []byte(strconv.Itoa(other.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := f.manager().Ensure(context.Background(), gpuUUID, settings)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != first.PID {
		t.Errorf("a restarted agent adopted pid %d from the pod-writable pid file, want its own record %d", st.PID, first.PID)
	}
}
