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

// MPSTenantsDir holds a GPU's per-namespace MPS daemons: <root>/<gpu-uuid>/ns. It sits beside the GPU's
// pipe/ and shm/, never inside a directory a pod mounts.
func MPSTenantsDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "ns") }

// MPSTenantDir is one namespace's MPS daemon directory on a GPU: <root>/<gpu-uuid>/ns/<namespace>, with
// pipe/, log/ and shm/ inside as a GPU's daemon has them. The DRA kubelet plugin starts one daemon per
// (GPU, namespace) there and mounts only that namespace's pipe/ and shm/ into its claims' containers, so
// tenants of different namespaces share no daemon, no socket and no shared memory.
func MPSTenantDir(mpsRoot, gpuUUID, namespace string) string {
	return filepath.Join(MPSTenantsDir(mpsRoot, gpuUUID), namespace)
}

// MPSTenantPipeDir is a namespace's CUDA_MPS_PIPE_DIRECTORY on a GPU: <root>/<gpu-uuid>/ns/<namespace>/pipe.
func MPSTenantPipeDir(mpsRoot, gpuUUID, namespace string) string {
	return filepath.Join(MPSTenantDir(mpsRoot, gpuUUID, namespace), "pipe")
}

// MPSTenantShmDir is a namespace's /dev/shm tmpfs on a GPU: <root>/<gpu-uuid>/ns/<namespace>/shm.
func MPSTenantShmDir(mpsRoot, gpuUUID, namespace string) string {
	return filepath.Join(MPSTenantDir(mpsRoot, gpuUUID, namespace), "shm")
}

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
