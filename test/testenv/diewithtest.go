package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// kube-apiserver and etcd die with the test process that started them. envtest starts them itself, with
// no way to ask for a parent-death signal, so it is given their paths as links to the test binary in a
// directory of their own: started under one of those names (and with the environment below), the test
// binary asks the kernel for SIGKILL when its parent dies and replaces itself with the real binary; the
// request survives the exec. A test binary killed by -timeout, a signal or a crash then leaves no control
// plane behind eating the CPU of the next run.

const (
	// realBinEnv names the directory of the real binaries, parentEnv the pid of the test process.
	realBinEnv = "GPUSHARING_TESTENV_REAL_BIN"
	parentEnv  = "GPUSHARING_TESTENV_PARENT"
)

// wrapped are the binaries envtest starts as long-running processes.
var wrapped = []string{"etcd", "kube-apiserver"}

func init() {
	dir, parent := os.Getenv(realBinEnv), os.Getenv(parentEnv)
	name := filepath.Base(os.Args[0])
	if dir == "" || parent == "" || (name != wrapped[0] && name != wrapped[1]) {
		return
	}
	os.Exit(execDyingWithParent(filepath.Join(dir, name), parent))
}

// execDyingWithParent replaces this process with path (same arguments and environment, less the two
// variables above) after asking for SIGKILL when the parent dies; it returns an exit code only on failure.
func execDyingWithParent(path, parent string) int {
	// The parent-death signal is a property of the calling thread, and it is that thread that must exec.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: asking for SIGKILL at the test process's death: %v\n", err)
		return 1
	}
	// The test process may have died before the request: then nobody will signal this process.
	if strconv.Itoa(os.Getppid()) != parent {
		fmt.Fprintf(os.Stderr, "testenv: the test process %s is gone; not starting %s\n", parent, path)
		return 1
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !hasKey(kv, realBinEnv) && !hasKey(kv, parentEnv) {
			env = append(env, kv)
		}
	}
	err := unix.Exec(path, append([]string{path}, os.Args[1:]...), env)
	fmt.Fprintf(os.Stderr, "testenv: exec %s: %v\n", path, err)
	return 127
}

func hasKey(kv, key string) bool {
	return len(kv) > len(key) && kv[:len(key)] == key && kv[len(key)] == '='
}

// dyingBinDir makes a directory in which etcd and kube-apiserver start the real ones in bin so that
// they die with this process; it sets the environment those starts read. The caller removes the
// directory.
func dyingBinDir(bin string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the test binary: %w", err)
	}
	absBin, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "testenv-bin")
	if err != nil {
		return "", err
	}
	for _, name := range wrapped {
		if err := os.Symlink(self, filepath.Join(dir, name)); err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	// Read by the children envtest starts (they inherit this process's environment).
	if err := os.Setenv(realBinEnv, absBin); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	if err := os.Setenv(parentEnv, strconv.Itoa(os.Getpid())); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}
