package scheduler

import (
	"strconv"

	"github.com/gpusharing/gpusharing/agent/procfs"
)

// gangKey is the gang of the client whose kernel pid is pid: Options.GangKey's, else the sid field of
// its /proc stat ("sid:<sid>": a job started under setsid); "" where the kernel gave no pid, the
// process is gone or it opted out of gangs (GangOptedOut).
func (s *Scheduler) gangKey(pid int32) string {
	if pid == 0 || GangOptedOut(s.procRoot(), pid) {
		return ""
	}
	if s.opts.GangKey != nil {
		return s.opts.GangKey(pid)
	}
	if sid, ok := sessionOf(s.procRoot(), pid); ok {
		return "sid:" + strconv.Itoa(int(sid))
	}
	return ""
}

// sessionOf reads the session id of pid from <procRoot>/<pid>/stat; false where the process is gone
// or its session leader is outside procRoot's PID namespace (session 0).
func sessionOf(procRoot string, pid int32) (int32, bool) {
	f, err := procfs.StatFields(procRoot, int(pid))
	if err != nil || len(f) < 4 {
		return 0, false
	}
	sid, err := strconv.ParseInt(f[3], 10, 32)
	if err != nil || sid <= 0 {
		return 0, false
	}
	return int32(sid), true
}
