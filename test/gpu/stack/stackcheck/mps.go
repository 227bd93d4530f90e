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

// checkMPSShm checks the GPU's /dev/shm: Allocate mounts the GPU's own directory, the agent mounted a
// tmpfs of --mps-shm-size there, and the control daemon and every MPS server see that tmpfs as their
// /dev/shm (same device through their mount namespace). The MPS client that follows can only work if
// it shares that memory with its server.
func (s *stack) checkMPSShm(ctx context.Context, alloc *allocation, daemon int) {
	shm := filepath.Join(s.mpsRoot, s.gpuUUID, "shm")
	var host string
	for _, m := range alloc.resp.Mounts {
		if m.ContainerPath == "/dev/shm" {
			host = m.HostPath
		}
	}
	s.r.check("Allocate: /dev/shm is the GPU's own tmpfs directory", host == shm, "mounts /dev/shm from %q, want %q", host, shm)
	var fs syscall.Statfs_t
	err := syscall.Statfs(shm, &fs)
	s.r.check("host: the GPU's /dev/shm is a tmpfs capped at --mps-shm-size", err == nil && fs.Type == tmpfsMagic && int64(fs.Blocks)*fs.Bsize == mpsShmSize,
		"statfs %v: type %#x, %d bytes, want tmpfs of %d", err, fs.Type, int64(fs.Blocks)*fs.Bsize, int64(mpsShmSize))
	pids := []int{daemon}
	if out, err := mpsControl(ctx, s.mpsRoot, s.gpuUUID, "get_server_list"); err == nil {
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		on, err := sameFile(filepath.Join("/proc", strconv.Itoa(pid), "root/dev/shm"), shm)
		s.r.check(fmt.Sprintf("GPU: MPS process %d sees the GPU's tmpfs as /dev/shm", pid), on, "%v", err)
	}
	s.r.check("host: no node-wide MPS shm directory", !exists(filepath.Join(s.mpsRoot, "shm")), "%s exists", filepath.Join(s.mpsRoot, "shm"))
}

// tmpfsMagic is TMPFS_MAGIC, statfs's type of a tmpfs.
const tmpfsMagic = 0x01021994

// sameFile reports whether a and b are one directory: the same device and inode.
func sameFile(a, b string) (bool, error) {
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := syscall.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// mountsUnder lists the mount points below dir in this mount namespace.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	return points
}

// unmountUnder unmounts what mountsUnder lists, the latest first.
func unmountUnder(dir string) {
	points := mountsUnder(dir)
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}
