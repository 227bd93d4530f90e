// Package smi reads nvidia-smi's per-process view, which the GPU checks compare the agent's accounting
// with. It only queries: nothing here changes the GPU.
package smi

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Memory is nvidia-smi's used memory per compute process, in bytes.
func Memory() (map[int32]uint64, error) {
	out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi --query-compute-apps: %w", err)
	}
	m := map[int32]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(strings.TrimSpace(f[0]))
		mib, err2 := strconv.ParseUint(strings.TrimSpace(f[1]), 10, 64)
		if err1 == nil && err2 == nil {
			m[int32(pid)] = mib << 20
		}
	}
	return m, nil
}

// Pmon is nvidia-smi pmon's SM percent per process (one sample; 0 where pmon shows "-").
func Pmon() (map[int32]float64, error) {
	out, err := exec.Command("nvidia-smi", "pmon", "-c", "1", "-s", "u").Output()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi pmon: %w", err)
	}
	m := map[int32]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		// gpu pid type sm mem enc dec ... command
		if len(f) < 5 {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		sm, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			sm = 0 // "-": no sample in pmon's window
		}
		m[int32(pid)] = sm
	}
	return m, nil
}

// Rel is |a-b|/b (0 when both are 0, 1 when only b is).
func Rel(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 0
		}
		return 1
	}
	d := a - b
	if d < 0 {
		d = -d
	}
	return d / b
}

// Mean is the mean of xs (0 for none).
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
