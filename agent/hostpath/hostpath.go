// Package hostpath is the one definition of the host directory layout the agent shares with pods: the
// MPS package starts each GPU's daemon in these directories and the agent's shim scheduler listens on
// these sockets, and the device plugin mounts the same ones into pods, so all call these functions and
// cannot drift apart.
package hostpath

import "path/filepath"

// MPSPipeDir is a GPU's CUDA_MPS_PIPE_DIRECTORY under the MPS root: <root>/<gpu-uuid>/pipe.
func MPSPipeDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "pipe") }

// MPSLogDir is a GPU's CUDA_MPS_LOG_DIRECTORY under the MPS root: <root>/<gpu-uuid>/log.
// MPSShmDir is the shared memory directory of every MPS daemon on the node and of their clients: MPS
// servers and clients exchange work through POSIX shared memory, so a client in its own pod must see the
// daemon's /dev/shm. The agent (whose children the daemons are) and each MPS client container mount it
// at /dev/shm. Under /run it is a tmpfs on usual hosts, as /dev/shm is.
func MPSShmDir(mpsRoot string) string { return filepath.Join(mpsRoot, "shm") }

func MPSLogDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "log") }

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
