package localnode

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Down stops the node and removes what it made: the kubelet first (pods keep running, as on a real
// node), then every container (the runc shims and all they started), containerd, the controllers and the
// API server; then mounts, cgroups, the CNI bridge and the directories. Logs are copied to keepLogs
// (when not empty) before Root goes.
func (n *Node) Down(keepLogs string) error {
	if n.kubelet != nil {
		n.kubelet.stop(30 * time.Second)
	}
	var errs []error
	if keepLogs != "" {
		if err := copyDir(n.LogDir(), keepLogs); err != nil {
			errs = append(errs, fmt.Errorf("keeping the logs: %w", err))
		}
		// Container logs: <namespace>_<pod>_<uid>/<container>/<restart>.log -> pods/<pod>.<container>.<restart>.log
		files, _ := filepath.Glob(filepath.Join(PodLogs, "*", "*", "*.log"))
		for _, f := range files {
			rel, _ := filepath.Rel(PodLogs, f)
			parts := strings.Split(rel, string(filepath.Separator))
			pod := strings.Split(parts[0], "_")
			if len(pod) < 2 {
				continue
			}
			name := pod[0] + "." + pod[1] + "." + parts[1] + "." + parts[2]
			if data, err := os.ReadFile(f); err == nil {
				_ = os.MkdirAll(filepath.Join(keepLogs, "pods"), 0o755)
				_ = os.WriteFile(filepath.Join(keepLogs, "pods", name), data, 0o644)
			}
		}
	}
	// The containers next (their watches would hold the API server's graceful shutdown open), then the
	// rest in reverse start order.
	killTree(n.shimPids())
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].stop(15 * time.Second)
	}
	if n.env != nil {
		if err := n.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping etcd and kube-apiserver: %w", err))
		}
	}
	for _, l := range n.logs {
		_ = l.Close()
	}
	if err := n.cleanup(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cleanup kills what a run may have left (containers, shims, the agent's stand-in MPS daemons), then
// unmounts, removes cgroups, the bridge and the directories. It is safe on a clean machine.
func (n *Node) cleanup() error {
	killTree(n.shimPids())
	// Stray component processes of a killed run.
	killTree(pidsWhere(n.ours))
	var errs []error
	for _, m := range n.mounts() {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	removeCgroups()
	if hasNodeIP() {
		if out, err := exec.Command("ip", "addr", "del", NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("removing %s from lo: %v: %s", NodeIP, err, out))
		}
	}
	if _, err := os.Stat("/sys/class/net/" + BridgeName); err == nil {
		if out, err := exec.Command("ip", "link", "delete", BridgeName).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %v: %s", BridgeName, err, out))
		}
	}
	for _, d := range append([]string{n.Root}, HostDirs...) {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	specs, _ := filepath.Glob(CDISpecs)
	for _, f := range specs {
		if err := os.Remove(f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists what a finished run must not leave: its processes (components and containers), mounts
// under its directories, kubepods cgroups, the bridge, the node address.
func (n *Node) Leftovers() []string {
	var out []string
	for _, pid := range append(n.shimPids(), pidsWhere(n.ours)...) {
		out = append(out, fmt.Sprintf("process %d (%s)", pid, cmdline(pid)))
	}
	for _, m := range n.mounts() {
		out = append(out, "mount "+m)
	}
	for _, c := range kubepodsCgroups() {
		out = append(out, "cgroup "+c)
	}
	if _, err := os.Stat("/sys/class/net/" + BridgeName); err == nil {
		out = append(out, "link "+BridgeName)
	}
	if hasNodeIP() {
		out = append(out, "address "+NodeIP+" on lo")
	}
	specs, _ := filepath.Glob(CDISpecs)
	for _, f := range specs {
		out = append(out, "CDI spec "+f)
	}
	for _, d := range append([]string{n.Root}, HostDirs...) {
		if _, err := os.Stat(d); err == nil {
			out = append(out, "directory "+d)
		}
	}
	return out
}

func hasNodeIP() bool {
	out, _ := exec.Command("ip", "-o", "addr", "show", "dev", "lo").Output()
	return strings.Contains(string(out), " "+NodeIP+"/")
}

// ours is a process of this run: a binary from bin/ whose arguments name the run's directories (other
// tests on the machine run etcd and kube-apiserver from the same bin/; they are not ours).
func (n *Node) ours(_ int, exe string, args []string) bool {
	if !strings.HasPrefix(exe, n.Bin+"/") {
		return false
	}
	for _, a := range args {
		if strings.Contains(a, n.Root) || strings.Contains(a, KubeletRoot) {
			return true
		}
	}
	return false
}

// shimPids are the containerd runc shims of this node's containerd, found by their -address argument.
func (n *Node) shimPids() []int {
	sock := filepath.Join(n.Root, "containerd", "containerd.sock")
	return pidsWhere(func(_ int, exe string, args []string) bool {
		if !strings.HasSuffix(exe, "containerd-shim-runc-v2") {
			return false
		}
		for _, a := range args {
			if a == sock {
				return true
			}
		}
		return false
	})
}

// mounts lists mount points under the run's directories, deepest first.
func (n *Node) mounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	roots := append([]string{n.Root}, HostDirs...)
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, r := range roots {
			if mp == r || strings.HasPrefix(mp, r+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// kubepodsCgroups are the kubelet's cgroup trees (cgroupfs driver), one per v1 hierarchy.
func kubepodsCgroups() []string {
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	return matches
}

// removeCgroups removes the kubepods trees bottom-up (a cgroup can only be removed once empty).
func removeCgroups() {
	for _, top := range kubepodsCgroups() {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			_ = syscall.Rmdir(d)
		}
	}
}

// pidsWhere lists processes matching a predicate on (pid, executable, arguments).
func pidsWhere(match func(pid int, exe string, args []string) bool) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		exe = strings.TrimSuffix(exe, " (deleted)")
		if match(pid, exe, args(pid)) {
			out = append(out, pid)
		}
	}
	return out
}

func args(pid int) []string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}

func cmdline(pid int) string { return strings.Join(args(pid), " ") }

// killTree SIGKILLs the given processes and all their descendants, children first.
func killTree(roots []int) {
	if len(roots) == 0 {
		return
	}
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The parent is the second field after the parenthesised command, which may hold spaces.
		rest := string(data[strings.LastIndexByte(string(data), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	var order []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			walk(c)
		}
		order = append(order, p)
	}
	for _, r := range roots {
		walk(r)
	}
	for _, p := range order {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	// Let the kernel reap them before mounts are released.
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range order {
		for time.Now().Before(deadline) {
			if err := syscall.Kill(p, 0); err != nil {
				break
			}
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); strings.Contains(string(st), ") Z ") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func copyDir(from, to string) error {
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
