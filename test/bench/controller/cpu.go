package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// serverCPU is the CPU time (user + system, seconds) kube-apiserver and etcd have used so far: the
// bench's own children, found by parent pid. Both the floor and the controller pay the API server per
// write, so its CPU per write says whether a change made writes cheaper or only fewer, and on a
// loaded machine it moves far less than wall time does.
func serverCPU() map[string]float64 {
	out := map[string]float64{}
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		comm, fields, ok := parseStat(string(raw))
		if !ok || fields[1] != self || comm != "kube-apiserver" && comm != "etcd" {
			continue
		}
		utime, err1 := strconv.ParseFloat(fields[11], 64)
		stime, err2 := strconv.ParseFloat(fields[12], 64)
		if err1 == nil && err2 == nil {
			out[comm] += (utime + stime) / clockTicks
		}
	}
	return out
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go runs the bench on.
const clockTicks = 100

// parseStat splits /proc/<pid>/stat: the command (in parentheses, and it may hold spaces) and the
// fields after it, so fields[0] is the state, fields[1] the parent pid, fields[11] utime, fields[12]
// stime.
func parseStat(s string) (string, []string, bool) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 13 {
		return "", nil, false
	}
	return s[open+1 : end], fields, true
}

// cpuSince formats the servers' CPU between two readings, per write when writes were most of the work
// (a manager's start-up lists every object and writes one lease: no per-write figure there).
func cpuSince(after, before map[string]float64, writes float64) string {
	api, etcd := after["kube-apiserver"]-before["kube-apiserver"], after["etcd"]-before["etcd"]
	s := fmt.Sprintf("CPU: kube-apiserver %.1fs, etcd %.1fs", api, etcd)
	if writes >= 100 {
		s += fmt.Sprintf(" (%.1f ms and %.1f ms a write)", api*1000/writes, etcd*1000/writes)
	}
	return s
}
