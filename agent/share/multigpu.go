package share

import (
	"path/filepath"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// MaxShimGPUs is how many GPUs the shim serves in one process (GS_MAX_DEVS in shim/src/internal.h); it
// leaves any further GPU of the list unshared.
const MaxShimGPUs = 16

// gpuShares are a container's shares of one GPU.
type gpuShares struct {
	uuid string
	devs []Device
}

// byGPU groups devs by GPU, in the order CUDA_VISIBLE_DEVICES names the GPUs (uniqueVisible's).
func byGPU(devs []Device) []gpuShares {
	var out []gpuShares
	at := map[string]int{}
	for _, d := range devs {
		i, ok := at[d.GPUUUID]
		if !ok {
			i = len(out)
			at[d.GPUUUID] = i
			out = append(out, gpuShares{uuid: d.GPUUUID})
		}
		out[i].devs = append(out[i].devs, d)
	}
	return out
}

func countSized(devs []Device) (n int) {
	for _, d := range devs {
		if d.Sized {
			n++
		}
	}
	return n
}

// ContainerSchedulerDirOf is where the scheduler socket directory of one of several GPUs is mounted in
// a container with shim shares of several GPUs.
func ContainerSchedulerDirOf(gpuUUID string) string {
	return filepath.Join(ContainerSchedulerDir, gpuUUID)
}

// addShimGPUs gives a container shim shares of several GPUs: each GPU's scheduler socket directory
// mounted at ContainerSchedulerDirOf(uuid), and every per-GPU variable as a list of <uuid>=<value>
// pairs in the order of CUDA_VISIBLE_DEVICES (docs/deviceplugin.md, "Several GPUs in one container"):
//
//	GPUSHARE_GPU_UUID=GPU-a,GPU-b
//	GPUSHARE_SOCKET=GPU-a=/var/run/gpusharing/scheduler/GPU-a/gpushare.sock,GPU-b=...
//	GPUSHARE_OVERSUB=GPU-a=1,GPU-b=0
//	GPUSHARE_MEMORY_LIMIT_BYTES=GPU-a=4294967296,GPU-b=0   (only when a share is sized; 0: no limit)
//
// A container with shares of one GPU keeps the single-value form (addShim). Neither a uuid nor a
// path the agent makes holds ',' or '='.
func addShimGPUs(cfg Config, resp *pluginapi.ContainerAllocateResponse, gpus []gpuShares) {
	resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: ContainerShimLibrary, HostPath: cfg.ShimLibrary, ReadOnly: true})
	var uuids, sockets, oversub, limits []string
	anyLimit := false
	for _, g := range gpus {
		sock := cfg.SchedulerSocketPath(g.uuid)
		dir := ContainerSchedulerDirOf(g.uuid)
		// The directory rather than the socket, as for one GPU: a restarted scheduler's new socket is seen.
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: dir, HostPath: filepath.Dir(sock), ReadOnly: true})
		var limit int64
		ov := "0"
		for _, d := range g.devs {
			limit += d.MemoryLimitBytes
			if d.ShimOversub {
				ov = "1"
			}
		}
		anyLimit = anyLimit || limit > 0
		uuids = append(uuids, g.uuid)
		sockets = append(sockets, g.uuid+"="+filepath.Join(dir, filepath.Base(sock)))
		oversub = append(oversub, g.uuid+"="+ov)
		limits = append(limits, g.uuid+"="+strconv.FormatInt(limit, 10))
	}
	resp.Envs[EnvLDPreload] = ContainerShimLibrary
	resp.Envs[EnvShimGPUUUID] = strings.Join(uuids, ",")
	resp.Envs[EnvShimSocket] = strings.Join(sockets, ",")
	resp.Envs[EnvShimOversub] = strings.Join(oversub, ",")
	if anyLimit {
		resp.Envs[EnvShimMemoryLimit] = strings.Join(limits, ",")
	}
}
