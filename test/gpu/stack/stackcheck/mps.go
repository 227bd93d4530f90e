package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// mpsControl sends one command to the control daemon of the GPU whose pipe directory is under root.
func mpsControl(ctx context.Context, root, uuid, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nvidia-cuda-mps-control")
	cmd.Env = append(os.Environ(),
		"CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(root, uuid, "pipe"),
		"CUDA_MPS_LOG_DIRECTORY="+filepath.Join(root, uuid, "log"))
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// mpsClients lists the client pids of every MPS server of the GPU, as the control daemon reports them.
func mpsClients(ctx context.Context, root, uuid string) []int {
	servers, err := mpsControl(ctx, root, uuid, "get_server_list")
	if err != nil {
		return nil
	}
	var pids []int
	for _, srv := range strings.Fields(servers) {
		out, err := mpsControl(ctx, root, uuid, "get_client_list "+srv)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// quitMPSDaemons quits every control daemon whose pipe directory is under root (the safety net that
// keeps the shared machine clean whatever the agent did).
func quitMPSDaemons(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(root, e.Name(), "pipe", "nvidia-cuda-mps-control.pid")); err == nil {
			_, _ = mpsControl(context.Background(), root, e.Name(), "quit")
		}
	}
}

// mpsProcesses lists the pids of MPS control daemons and servers on the machine.
func mpsProcesses() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(comm)), "nvidia-cuda-mps") && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive says whether pid runs. A zombie has exited: the daemonized MPS control process is reparented to
// the machine's init, which may reap it a while later (the agent judges it the same way).
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
