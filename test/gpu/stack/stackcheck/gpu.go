package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// nvidia-smi is only read here: queries change nothing on the GPU.
func smiQuery(ctx context.Context, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, "nvidia-smi", args...).Output()
	return strings.TrimSpace(string(out))
}

func gpuFreeMiB(ctx context.Context, index int) int {
	v, _ := strconv.Atoi(smiQuery(ctx, "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", strconv.Itoa(index)))
	return v
}

// gpuProcesses lists the compute processes on the GPU.
func gpuProcesses(ctx context.Context, index int) []int {
	var pids []int
	for _, f := range strings.Fields(smiQuery(ctx, "--query-compute-apps=pid", "--format=csv,noheader", "-i", strconv.Itoa(index))) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
