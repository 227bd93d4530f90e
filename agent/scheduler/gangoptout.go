package scheduler

import "github.com/gpusharing/gpusharing/agent/procfs"

// Running without a gang.
//
// A gang serves a job whose processes wait on each other across GPUs (collectives). A pod whose
// processes use several GPUs independently (one worker per GPU, data-parallel inference without
// collectives) gains nothing from taking its turns on all its GPUs at once, and waits for all of them
// at every turn. Such a process opts out with GPUSHARE_GANG=off (or 0, false) in its environment: its
// clients are single clients on each of its GPUs, under each GPU's own rules.
//
// The scheduler reads the variable from the process's start environment (/proc/<pid>/environ), the
// pod's container env or its launcher's: the process's word, which it may give because opting out
// only changes its own progress. A single client is bound by each GPU's quantum plus grace and by
// production's preemption like any other, so no other tenant's guarantee depends on who is in a gang.
// Nothing in the protocol changes: any shim version opts out the same way.

// GangOptOutEnv is the variable a process opts out of gangs with.
const GangOptOutEnv = "GPUSHARE_GANG"

// GangOptedOut: the process pid (under procRoot) started with GPUSHARE_GANG=off, 0 or false.
func GangOptedOut(procRoot string, pid int32) bool {
	v, ok := procfs.EnvValue(procRoot, int(pid), GangOptOutEnv)
	return ok && (v == "off" || v == "0" || v == "false")
}

// procRoot is where the scheduler sees its clients' processes.
func (s *Scheduler) procRoot() string {
	if s.opts.ProcRoot != "" {
		return s.opts.ProcRoot
	}
	return "/proc"
}
