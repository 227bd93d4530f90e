package scheduler

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// gangKey is the gang of the client whose kernel pid is pid: Options.GangKey's, else the sid field of
// its /proc stat ("sid:<sid>": a job started under setsid); "" where the kernel gave no pid or the
// process is gone.
func (s *Scheduler) gangKey(pid int32) string {
	if pid == 0 {
		return ""
	}
	if s.opts.GangKey != nil {
		return s.opts.GangKey(pid)
	}
	if sid, ok := sessionOf("/proc", pid); ok {
		return "sid:" + strconv.Itoa(int(sid))
	}
	return ""
}

// sessionOf reads the session id of pid from <procRoot>/<pid>/stat. Its second field, the command
// name, may hold spaces and parentheses, so the fields are counted after its last ')': state, ppid,
// pgrp, session.
func sessionOf(procRoot string, pid int32) (int32, bool) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "stat"))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return 0, false
	}
	sid, err := strconv.ParseInt(string(f[3]), 10, 32)
	if err != nil || sid <= 0 {
		return 0, false
	}
	return int32(sid), true
}
