// Package hostpath is the one definition of the host directory layout the agent shares with pods: the
// MPS package starts each GPU's daemon in these directories and the agent's shim scheduler listens on
// these sockets, and the device plugin mounts the same ones into pods, so all call these functions and
// cannot drift apart.
package hostpath

import "path/filepath"

// MPSPipeDir is a GPU's CUDA_MPS_PIPE_DIRECTORY under the MPS root: <root>/<gpu-uuid>/pipe.
func MPSPipeDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "pipe") }

// MPSLogDir is a GPU's CUDA_MPS_LOG_DIRECTORY under the MPS root: <root>/<gpu-uuid>/log.
func MPSLogDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "log") }

// MPSShmDir is a GPU's shared memory directory under the MPS root: <root>/<gpu-uuid>/shm. MPS servers and
// clients exchange work through POSIX shared memory, so a client in its own pod must see its daemon's
// /dev/shm. The agent mounts a size-capped tmpfs here for each MPS GPU and starts that GPU's daemon in a
// mount namespace where it is /dev/shm; each MPS client container of the GPU mounts it at /dev/shm. One per
// GPU: a pod can fill only its own GPU's, up to the cap, and never sees another GPU's daemon's memory.
func MPSShmDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "shm") }

// SchedulerSocketName is the file name of a GPU's shim scheduler socket in its directory.
const SchedulerSocketName = "gpushare.sock"

// SchedulerDir is a GPU's shim scheduler directory under the scheduler root: <root>/<gpu-uuid>. Pods mount
// the directory, not the socket, so a socket the agent re-creates is seen in running pods.
func SchedulerDir(schedulerRoot, gpuUUID string) string { return filepath.Join(schedulerRoot, gpuUUID) }

// SchedulerSocket is a GPU's shim scheduler socket (GPUSHARE_SOCKET on the host side):
// <root>/<gpu-uuid>/gpushare.sock.
func SchedulerSocket(schedulerRoot, gpuUUID string) string {
	return filepath.Join(SchedulerDir(schedulerRoot, gpuUUID), SchedulerSocketName)
}
