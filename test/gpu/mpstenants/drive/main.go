// Command drive runs the agent's per-namespace MPS daemons on a real GPU for test/gpu/mpstenants/run.sh:
// it starts the daemons of two namespaces on one GPU through the agent's MPS manager (each in a mount
// namespace with its own tmpfs as /dev/shm, started through this binary's mps-launch as the agent starts
// them), runs one CUDA client per namespace at the same time, each in a mount namespace that holds only
// its namespace's pipe directory at /var/run/gpusharing/mps and its tmpfs at /dev/shm (what a claim's
// container gets), records what each daemon and the GPU show while both hold their contexts, and quits
// both daemons. It prints one JSON report.
//
//	drive --root DIR --uuid GPU-... --client "python3 mps_client.py"
//	drive mps-launch <shm-dir> <program> [args...]      (the manager's launcher)
//	drive as-tenant <pipe-dir> <shm-dir> <program> [args...]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/share"
)

const asTenant = "as-tenant"

type tenantReport struct {
	Namespace  string          `json:"namespace"`
	DaemonPID  int             `json:"daemonPid"`
	Client     json.RawMessage `json:"client"`
	ClientExit string          `json:"clientExit"`
	Servers    []int           `json:"servers"`
	Clients    int             `json:"clientsCounted"`
	ShmFiles   []string        `json:"shmFilesWhileHeld"`
	DirGone    bool            `json:"directoryRemovedAfterStop"`
}

type report struct {
	UUID          string         `json:"uuid"`
	Tenants       []tenantReport `json:"tenants"`
	ComputeApps   []string       `json:"computeAppsWhileHeld"`
	LeftoverPIDs  []int          `json:"leftoverProcesses"`
	Errors        []string       `json:"errors,omitempty"`
	NamespacesRan []string       `json:"namespacesRunningWhileHeld"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == mps.LaunchCommand {
		err := mps.Launch(os.Args[2:], os.Environ())
		fmt.Fprintf(os.Stderr, "%s: %v\n", mps.LaunchCommand, err)
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == asTenant {
		err := runAsTenant(os.Args[2:])
		fmt.Fprintf(os.Stderr, "%s: %v\n", asTenant, err)
		os.Exit(1)
	}
	control := flag.String("control", "nvidia-cuda-mps-control", "nvidia-cuda-mps-control")
	root := flag.String("root", "", "MPS root (a temp folder)")
	uuid := flag.String("uuid", "", "GPU uuid")
	client := flag.String("client", "", "client command (space separated); gets <cap MiB> -1 appended and holds until its stdin closes")
	flag.Parse()

	r := report{UUID: *uuid}
	fail := func(format string, args ...any) { r.Errors = append(r.Errors, fmt.Sprintf(format, args...)) }
	defer func() {
		out, _ := json.MarshalIndent(r, "", "  ")
		fmt.Println(string(out))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if !strings.Contains(*control, "/") {
		if p, err := exec.LookPath(*control); err == nil {
			*control = p
		}
	}
	self, err := os.Executable()
	if err != nil {
		fail("%v", err)
		return
	}
	m := mps.New(mps.Config{Control: *control, Root: *root, Launcher: self, ShmSize: 256 << 20, Runner: runner.Exec{}})
	settings := mps.Settings{ActiveThreadPercentage: 50}
	namespaces := []string{"team-a", "team-b"}
	type running struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
	}
	clients := map[string]running{}
	for _, ns := range namespaces {
		st, err := m.EnsureTenant(ctx, *uuid, ns, settings)
		if err != nil {
			fail("starting %s's daemon: %v", ns, err)
			return
		}
		r.Tenants = append(r.Tenants, tenantReport{Namespace: ns, DaemonPID: st.PID})
	}
	defer func() {
		for _, ns := range namespaces {
			if err := m.StopTenant(context.Background(), *uuid, ns); err != nil {
				fail("stopping %s's daemon: %v", ns, err)
			}
		}
		for i := range r.Tenants {
			_, err := os.Stat(filepath.Join(*root, *uuid, "ns", r.Tenants[i].Namespace))
			r.Tenants[i].DirGone = os.IsNotExist(err)
			if m.Alive(r.Tenants[i].DaemonPID) {
				r.LeftoverPIDs = append(r.LeftoverPIDs, r.Tenants[i].DaemonPID)
			}
			for _, s := range r.Tenants[i].Servers {
				if m.Alive(s) {
					r.LeftoverPIDs = append(r.LeftoverPIDs, s)
				}
			}
		}
	}()

	// Both clients open their contexts and hold them, so both servers run on the GPU at once.
	args := strings.Fields(*client)
	for i, ns := range namespaces {
		argv := append([]string{asTenant, m.TenantPipeDir(*uuid, ns), m.TenantShmDir(*uuid, ns)}, args...)
		c := exec.CommandContext(ctx, self, append(argv, "1024", "-1")...)
		c.Stderr = os.Stderr
		stdin, _ := c.StdinPipe()
		stdout, _ := c.StdoutPipe()
		if err := c.Start(); err != nil {
			fail("client of %s: %v", ns, err)
			return
		}
		clients[ns] = running{cmd: c, stdin: stdin}
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		if strings.TrimSpace(line) == "" {
			line = "null"
		}
		r.Tenants[i].Client = json.RawMessage(strings.TrimSpace(line))
	}
	m.Check(ctx)
	for _, t := range m.Tenants() {
		r.NamespacesRan = append(r.NamespacesRan, t.Namespace)
	}
	for i, ns := range namespaces {
		env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + m.TenantPipeDir(*uuid, ns), "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(*root, *uuid, "ns", ns, "log")}
		res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: *control, Env: env, Stdin: "get_server_list\n", Timeout: 10 * time.Second})
		if err != nil {
			fail("get_server_list of %s: %v", ns, err)
		}
		for _, f := range strings.Fields(res.Stdout) {
			if pid, err := strconv.Atoi(f); err == nil {
				r.Tenants[i].Servers = append(r.Tenants[i].Servers, pid)
			}
		}
		if st, ok := m.TenantStatus(*uuid, ns); ok {
			r.Tenants[i].Clients = st.Clients
		}
		entries, _ := os.ReadDir(m.TenantShmDir(*uuid, ns))
		for _, e := range entries {
			r.Tenants[i].ShmFiles = append(r.Tenants[i].ShmFiles, e.Name())
		}
	}
	if out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader", "-i", *uuid).Output(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				r.ComputeApps = append(r.ComputeApps, strings.TrimSpace(l))
			}
		}
	}
	for i, ns := range namespaces {
		_ = clients[ns].stdin.Close()
		if err := clients[ns].cmd.Wait(); err != nil {
			r.Tenants[i].ClientExit = err.Error()
		} else {
			r.Tenants[i].ClientExit = "0"
		}
	}
}

// runAsTenant runs a program as a claim's container sees MPS: in a mount namespace of its own, the
// namespace's pipe directory at /var/run/gpusharing/mps and its tmpfs at /dev/shm, and nothing of the
// other namespace's.
func runAsTenant(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("usage: %s <pipe-dir> <shm-dir> <program> [args...]", asTenant)
	}
	pipe, shm, argv := args[0], args[1], args[2:]
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := os.MkdirAll(share.ContainerMPSPipeDir, 0o755); err != nil {
		return err
	}
	for _, b := range [][2]string{{pipe, share.ContainerMPSPipeDir}, {shm, share.ContainerShm}} {
		if err := unix.Mount(b[0], b[1], "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s onto %s: %w", b[0], b[1], err)
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	env := append(os.Environ(), share.EnvMPSPipeDirectory+"="+share.ContainerMPSPipeDir)
	return unix.Exec(path, argv, env)
}
