package soak

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
)

// nvmlProcesses is NVML's per-process memory on the soak's GPUs, as the agent reads it
// (scheduler.Guards.ProcessMemory): the stub driver's holdings of every process that holds any, contexts
// included, whether it runs under the shim or not.
func nvmlProcesses(hold string, uuids []string) func(uuid string) (map[int32]uint64, error) {
	return func(uuid string) (map[int32]uint64, error) {
		all, err := holdings(hold)
		if err != nil {
			return nil, err
		}
		out := map[int32]uint64{}
		for pid, byDev := range all {
			for d, b := range byDev {
				if d < len(uuids) && uuids[d] == uuid && b > 0 {
					out[pid] += uint64(b)
				}
			}
		}
		return out, nil
	}
}

// holdings are the stub driver's holdings files in hold: bytes by stub device index, by pid.
func holdings(hold string) (map[int32]map[int]int64, error) {
	ents, err := os.ReadDir(hold)
	if err != nil {
		return nil, err
	}
	out := map[int32]map[int]int64{}
	for _, ent := range ents {
		pid, err := strconv.ParseInt(ent.Name(), 10, 32)
		if err != nil {
			continue // the stub's temporary files
		}
		out[int32(pid)] = readHold(holdFile(hold, int32(pid)))
	}
	return out, nil
}

// readHold is one process's holdings file: bytes by stub device index (nil: none).
func readHold(path string) map[int]int64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	out := map[int]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var d int
		var b int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &d, &b); err == nil && d >= 0 {
			out[d] += b
		}
	}
	return out
}
