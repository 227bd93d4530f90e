// Package fakebin writes fake host executables (nvidia-smi, nvidia-cuda-mps-control) as small shell
// scripts, for the agent's tests and the demo's simulated GPU nodes. Every fake appends one line per call to a log, so a test can assert the exact
// command sequence the agent ran, its stdin and the environment it passed, and that a pass with nothing
// to do ran nothing at all.
package fakebin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Fake is one fake executable and the log of its calls.
type Fake struct {
	// Path is the executable to point the agent at.
	Path string
	log  string
}

// Write creates an executable named name in dir, failing the test if it cannot; see New.
func Write(t testing.TB, dir, name, body string, env ...string) *Fake {
	t.Helper()
	f, err := New(dir, name, body, env...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// New creates an executable named name in dir. Each call logs "name args [<<< stdin] [VAR=value...]"
// (the listed env vars, when set) and then runs body, a POSIX sh fragment that sees the arguments as
// "$@" and the input in $stdin.
func New(dir, name, body string, env ...string) (*Fake, error) {
	log := filepath.Join(dir, name+".log")
	var envParts []string
	for _, e := range env {
		envParts = append(envParts, fmt.Sprintf(`${%s+ %s=$%s}`, e, e, e))
	}
	script := fmt.Sprintf(`#!/bin/sh
stdin=$(cat)
line="%s"
[ $# -gt 0 ] && line="$line $*"
[ -n "$stdin" ] && line="$line <<< $(printf '%%s' "$stdin" | tr '\n' ';')"
line="$line%s"
printf '%%s\n' "$line" >> '%s'
%s
`, name, strings.Join(envParts, ""), log, body)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return nil, err
	}
	return &Fake{Path: path, log: log}, nil
}

// Calls returns the logged calls and clears the log.
func (f *Fake) Calls(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(f.log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f.log); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(data), "\n"), "\n")
}

// MPSControl writes a fake nvidia-cuda-mps-control. With -d it starts a stand-in daemon (a sleep) and
// writes its pid to $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid as the real one does; commands
// on stdin fail like the real client when that daemon is not running; quit ends it; get_server_list and
// get_client_list print the files "servers" and "clients.<pid>" a test writes into the pipe directory.
// With ShmMarkerEnv set to a file name, -d writes $CUDA_VISIBLE_DEVICES into /dev/shm/<name>, so a test
// can find which /dev/shm the daemon saw. Cleanup ends the daemons and unmounts what the agent under
// test mounted in dir (the MPS tmpfs), so the test's temporary directory can be removed.
func MPSControl(t testing.TB, dir string) *Fake {
	t.Helper()
	f, err := NewMPSControl(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		KillDaemons(dir)
		if err := UnmountUnder(dir); err != nil {
			t.Error(err)
		}
	})
	return f
}

// ShmMarkerEnv names the file the fake MPS daemon writes into its /dev/shm; see MPSControl.
const ShmMarkerEnv = "FAKEBIN_MPS_SHM_MARKER"

// UnmountUnder unmounts every mount point below dir in this mount namespace, the latest first.
func UnmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	prefix := filepath.Clean(dir) + "/"
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		// Field 5 is the mount point, octal-escaped (\040 for a space); test directories have none.
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], prefix) {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", points[i], err)
		}
	}
	return nil
}

// NewMPSControl writes the fake nvidia-cuda-mps-control described at MPSControl. Its stand-in daemons
// outlive the caller: end them with KillDaemons.
func NewMPSControl(dir string) (*Fake, error) {
	return New(dir, "nvidia-cuda-mps-control", `
pipe="${CUDA_MPS_PIPE_DIRECTORY:?}"
pidfile="$pipe/nvidia-cuda-mps-control.pid"
if [ "$1" = "-d" ]; then
	[ -d "$pipe" ] || { echo "no pipe directory $pipe" >&2; exit 1; }
	[ -z "$`+ShmMarkerEnv+`" ] || printf '%s\n' "$CUDA_VISIBLE_DEVICES" > "/dev/shm/$`+ShmMarkerEnv+`"
	sleep 86400 </dev/null >/dev/null 2>&1 &
	echo $! > "$pidfile"
	exit 0
fi
if [ ! -f "$pidfile" ] || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
	echo "Cannot find MPS control daemon process" >&2
	exit 1
fi
set -- $stdin
case "$1" in
quit) kill "$(cat "$pidfile")"; rm -f "$pidfile" ;;
get_server_list) [ -f "$pipe/servers" ] && cat "$pipe/servers" ;;
get_client_list) [ -f "$pipe/clients.$2" ] && cat "$pipe/clients.$2" ;;
set_default_active_thread_percentage|set_default_device_pinned_mem_limit) ;;
*) echo "unknown command $1" >&2; exit 1 ;;
esac
exit 0
`, "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES")
}

// KillDaemons ends the stand-in MPS daemons started under root.
func KillDaemons(root string) {
	_ = filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err == nil && info.Name() == "nvidia-cuda-mps-control.pid" {
			if data, err := os.ReadFile(path); err == nil {
				var pid int
				if _, err := fmt.Sscan(string(data), &pid); err == nil && pid > 0 {
					if p, err := os.FindProcess(pid); err == nil {
						_ = p.Kill()
					}
				}
			}
		}
		return nil
	})
}

// NvidiaSMI writes a fake nvidia-smi that accepts compute-policy --set-timeslice and fails every other
// call, or fails every call with exit code 3 when fail is true.
func NvidiaSMI(t testing.TB, dir string, fail bool) *Fake {
	t.Helper()
	f, err := NewNvidiaSMI(dir, fail)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// NewNvidiaSMI writes the fake nvidia-smi described at NvidiaSMI.
func NewNvidiaSMI(dir string, fail bool) (*Fake, error) {
	body := `
case "$*" in
"compute-policy -i "*" --set-timeslice="[0-3]) echo "Set timeslice"; exit 0 ;;
esac
echo "unexpected call: $*" >&2
exit 2
`
	if fail {
		body = `echo "Insufficient Permissions" >&2; exit 3`
	}
	return New(dir, "nvidia-smi", body)
}
