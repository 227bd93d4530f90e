package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/wait"
)

// A gang's member in a real shim process on GPU 0 (the stub driver, its GPU held so that nothing
// completes) keeps at most the opportunistic queue's bound of launches outstanding while production is
// busy on GPU 1 only: a preemption there would leave at most that beside production's work.
func TestShimGangMemberIsPacedWhileProductionIsBusyOnItsOtherGPU(t *testing.T) {
	build := shimBuild(t)
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socks := []string{filepath.Join(dir, "0.sock"), filepath.Join(dir, "1.sock")}
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: socks[0]}, {UUID: "GPU-1", SocketPath: socks[1]}},
		Registerer: prometheus.NewRegistry(), EnvOverrides: true})
	if err != nil {
		t.Fatal(err)
	}
	var member atomic.Int32 // the shim process, whose gang is "1" with the raw client of pid 101
	s.gangKeyOf = func(kpid int32, h Message) string {
		if kpid == member.Load() || h.PID == 101 {
			return "1"
		}
		return ""
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	// Production asks for GPU 1 and releases it: busy there for RecentActivity.
	p1 := dialHello(t, socks[1], Message{Type: MsgHello, PID: 4000, Priority: ClassProduction, GPUUUID: "GPU-1"})
	p1.send(Message{Type: MsgRelease, Epoch: p1.hold()})
	dialHello(t, socks[1], Message{Type: MsgHello, PID: 101, Priority: ClassOpportunistic, GPUUUID: "GPU-1"})

	run, tr := filepath.Join(dir, "run"), filepath.Join(dir, "trace")
	if err := os.WriteFile(run, []byte("0\n"), 0o644); err != nil { // the GPU runs nothing until told
		t.Fatal(err)
	}
	e := &env{t: t, build: build, dir: dir, sock: socks[0], trace: tr, s: s}
	p := e.startProgram("pace_client", []string{"GPUSHARE_STUB_RUN_FILE=" + run, "GPUSHARE_LOG_LEVEL=info",
		"GPUSHARE_PACE_WAIT_MAX_MS=60000", "GPUSHARE_STUB_LAUNCH_US=100", "GPUSHARE_IDLE_MS=600000"},
		"launch", "kernel", "32")
	member.Store(int32(p.pid()))
	launches := func() int {
		b, _ := os.ReadFile(tr)
		n := 0
		for l := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 4 && f[0] == "Q" && strings.HasPrefix(f[3], "cuLaunch") {
				n++
			}
		}
		return n
	}
	// It waits with the bound's launches made (the W records of its polls), and makes no more.
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(tr)
		return strings.Contains(string(b), "\nW ") || strings.HasPrefix(string(b), "W "),
			"launches made " + strings.TrimSpace(p.stdout.String()) + " " + p.stderr.String()
	}, "the gang's member waits for its launches to complete")
	if n := launches(); n != int(DefaultOpportunisticQueue) {
		t.Fatalf("launches outstanding = %d, want the bound %d; stderr:\n%s", n, DefaultOpportunisticQueue, p.stderr.String())
	}
	if strings.Contains(p.stdout.String(), "launched 32") {
		t.Fatal("the member made all its launches with the GPU held")
	}
	if err := os.WriteFile(run, []byte("1000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 30*time.Second)
}
