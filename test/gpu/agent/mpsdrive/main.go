// Command mpsdrive drives the agent's MPS manager on a real GPU for test/gpu/agent/run.sh: it starts
// the daemon for one GPU with a thread percentage and pinned memory limit, runs a CUDA client under it
// that tries to allocate past the limit, kills the daemon and waits for the manager to restart it, runs
// a second client, and quits the daemon. It prints one JSON report.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/runner"
)

type report struct {
	UUID              string          `json:"uuid"`
	ReadyMS           float64         `json:"daemonReadyMs"`
	FirstPID          int             `json:"firstDaemonPid"`
	DefaultThreadPct  string          `json:"defaultActiveThreadPercentage"`
	DefaultPinnedMem  string          `json:"defaultPinnedMemLimit"`
	Client1           json.RawMessage `json:"client1"`
	ClientsWhileHeld  int             `json:"clientsCountedWhileHeld"`
	ServerPIDs        []int           `json:"serverPids"`
	RestartMS         float64         `json:"restartAfterKillMs"`
	SecondPID         int             `json:"secondDaemonPid"`
	Restarts          int             `json:"restarts"`
	Client2           json.RawMessage `json:"client2"`
	QuitOK            bool            `json:"quitOk"`
	LeftoverProcesses []int           `json:"leftoverProcesses"`
	Errors            []string        `json:"errors,omitempty"`
}

func main() {
	control := flag.String("control", "nvidia-cuda-mps-control", "nvidia-cuda-mps-control")
	root := flag.String("root", "", "MPS root (a temp folder)")
	uuid := flag.String("uuid", "", "GPU uuid")
	pct := flag.Int("threads", 50, "active thread percentage")
	limit := flag.Int64("limit-mib", 4096, "pinned memory limit in MiB")
	client := flag.String("client", "", "client command (space separated); gets <cap MiB> <hold s> appended")
	capMiB := flag.Int("cap-mib", 8192, "how much the first client tries to allocate")
	flag.Parse()

	r := report{UUID: *uuid}
	fail := func(format string, args ...any) { r.Errors = append(r.Errors, fmt.Sprintf(format, args...)) }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	if *control != "" && !strings.Contains(*control, "/") {
		if p, err := exec.LookPath(*control); err == nil {
			*control = p
		}
	}
	m := mps.New(mps.Config{Control: *control, Root: *root, Runner: runner.Exec{}, WatchInterval: 100 * time.Millisecond, BackoffInitial: 500 * time.Millisecond})
	go func() { _ = m.Run(ctx) }()
	settings := mps.Settings{ActiveThreadPercentage: int32(*pct), PinnedMemoryLimitMiB: *limit}
	env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + m.PipeDir(*uuid), "CUDA_MPS_LOG_DIRECTORY=" + m.LogDir(*uuid)}
	ctl := func(cmd string) string {
		res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: *control, Env: env, Stdin: cmd + "\n", Timeout: 10 * time.Second})
		if err != nil {
			fail("%s: %v", cmd, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	defer func() {
		out, _ := json.MarshalIndent(r, "", "  ")
		fmt.Println(string(out))
	}()

	t0 := time.Now()
	st, err := m.Ensure(ctx, *uuid, settings)
	if err != nil {
		fail("ensure: %v", err)
		return
	}
	r.ReadyMS = float64(time.Since(t0).Microseconds()) / 1000
	r.FirstPID = st.PID
	r.DefaultThreadPct = ctl("get_default_active_thread_percentage")
	r.DefaultPinnedMem = ctl("get_default_device_pinned_mem_limit 0")

	// Client 1 tries to allocate past the limit and holds its memory while the manager counts it.
	args := strings.Fields(*client)
	c1 := exec.CommandContext(ctx, args[0], append(args[1:], strconv.Itoa(*capMiB), "4")...)
	c1.Env = append(os.Environ(), env...)
	c1.Stderr = os.Stderr
	stdout, _ := c1.StdoutPipe()
	if err := c1.Start(); err != nil {
		fail("client 1: %v", err)
		return
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	r.Client1 = json.RawMessage(strings.TrimSpace(orNull(line)))
	m.Check(ctx)
	if st, ok := m.Status(*uuid); ok {
		r.ClientsWhileHeld = st.Clients
	}
	for _, f := range strings.Fields(ctl("get_server_list")) {
		if pid, err := strconv.Atoi(f); err == nil {
			r.ServerPIDs = append(r.ServerPIDs, pid)
		}
	}
	if err := c1.Wait(); err != nil {
		fail("client 1 exited: %v", err)
	}

	// Kill the control daemon and its server (processes this test started, by pid) and time the restart.
	_ = syscall.Kill(st.PID, syscall.SIGKILL)
	for _, pid := range r.ServerPIDs {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	t1 := time.Now()
	for {
		st2, _ := m.Status(*uuid)
		if st2.State == mps.StateRunning && st2.PID != 0 && st2.PID != st.PID {
			r.RestartMS = float64(time.Since(t1).Microseconds()) / 1000
			r.SecondPID, r.Restarts = st2.PID, st2.Restarts
			break
		}
		if time.Since(t1) > 60*time.Second {
			fail("the manager did not restart the daemon within 60s: %+v", st2)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Client 2 runs under the restarted daemon.
	c2 := exec.CommandContext(ctx, args[0], append(args[1:], "1024", "0")...)
	c2.Env = append(os.Environ(), env...)
	c2.Stderr = os.Stderr
	out, err := c2.Output()
	if err != nil {
		fail("client 2: %v", err)
	}
	r.Client2 = json.RawMessage(strings.TrimSpace(orNull(string(out))))
	servers := ctl("get_server_list")

	if err := m.Stop(ctx, *uuid); err != nil {
		fail("stop: %v", err)
	}
	r.QuitOK = !m.Running(*uuid)
	time.Sleep(500 * time.Millisecond)
	for _, f := range append(strings.Fields(servers), strconv.Itoa(r.SecondPID), strconv.Itoa(st.PID)) {
		if pid, err := strconv.Atoi(f); err == nil && m.Alive(pid) {
			r.LeftoverProcesses = append(r.LeftoverProcesses, pid)
		}
	}
}

func orNull(s string) string {
	if strings.TrimSpace(s) == "" {
		return "null"
	}
	return s
}
