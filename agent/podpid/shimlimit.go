package podpid

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ShimLimit is the memory limit the shim of process pid (under procRoot, "" for /proc) runs under on GPU
// gpu: GPUSHARE_MEMORY_LIMIT_BYTES in the environment the process started with, as the kubelet plugin
// wrote it for its pod's claims there (one figure where the process has one GPU, else uuid=bytes per
// GPU, as the shim reads it). It needs no API server. A process may start with another figure than its
// pod was given, but the shim runs under that figure whatever is read here, so it bounds the process
// no less than the shim does. False where the process names no limit for gpu or its environment
// cannot be read.
func ShimLimit(procRoot string, pid int32, gpu string) (uint64, bool) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	raw, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		return 0, false
	}
	var uuids, limits string
	for _, kv := range bytes.Split(raw, []byte{0}) {
		k, v, _ := strings.Cut(string(kv), "=")
		switch k {
		case "GPUSHARE_GPU_UUID":
			uuids = v
		case "GPUSHARE_MEMORY_LIMIT_BYTES":
			limits = v
		}
	}
	return limitFor(uuids, limits, gpu)
}

// limitFor is gpu's figure in a GPUSHARE_MEMORY_LIMIT_BYTES of the list form (uuid=bytes,...), or the
// one figure where GPUSHARE_GPU_UUID names gpu alone (or nothing).
func limitFor(uuids, limits, gpu string) (uint64, bool) {
	if limits == "" {
		return 0, false
	}
	if !strings.Contains(limits, "=") {
		if uuids != "" && uuids != gpu {
			return 0, false
		}
		n, err := strconv.ParseUint(limits, 10, 64)
		return n, err == nil && n > 0
	}
	for item := range strings.SplitSeq(limits, ",") {
		u, v, ok := strings.Cut(item, "=")
		if ok && u == gpu {
			n, err := strconv.ParseUint(v, 10, 64)
			return n, err == nil && n > 0
		}
	}
	return 0, false
}
