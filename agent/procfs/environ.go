package procfs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// maxEnviron bounds what EnvValue reads of an environment: the kernel keeps it in the process's
// memory, and a process may make it as large as its argument limit.
const maxEnviron = 1 << 20

// EnvValue returns the value of name in the environment pid started with (<root>/<pid>/environ: the
// environment given at exec, never what the process set after), and whether it is there. A process
// that is gone, unreadable, or whose environment is larger than a MiB reads as not having it.
func EnvValue(root string, pid int, name string) (string, bool) {
	f, err := os.Open(filepath.Join(root, strconv.Itoa(pid), "environ"))
	if err != nil {
		return "", false
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxEnviron+1))
	if err != nil || len(b) > maxEnviron {
		return "", false
	}
	prefix := []byte(name + "=")
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v), true
		}
	}
	return "", false
}
