package procfs

import (
	"os"
	"path/filepath"
	"strconv"
)

// Stopped reports whether every live thread of process pid under root is stopped: state T (a stop
// signal: SIGSTOP, SIGTSTP, job control) or t (stopped by a tracer: a debugger, py-spy). Threads that
// are exiting (Z, X) are left out. A process with one thread running, sleeping or in the kernel is not
// stopped: its shim thread can still answer. A missing process is an error that os.IsNotExist
// recognizes; a thread that ends between the listing and its read is skipped.
func Stopped(root string, pid int) (bool, error) {
	dir := filepath.Join(root, strconv.Itoa(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	live := 0
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := StatFields(dir, tid)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil || len(f) == 0 {
			return false, err
		}
		switch f[0] {
		case "Z", "X":
			continue
		case "T", "t":
			live++
		default:
			return false, nil
		}
	}
	return live > 0, nil
}
