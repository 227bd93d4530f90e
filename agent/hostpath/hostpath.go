// Package hostpath is the one definition of the host directory layout the agent shares with pods: the
// MPS package starts each GPU's daemon in these directories and the device plugin mounts the same ones
// into MPS clients, so both call these functions and cannot drift apart.
package hostpath

import "path/filepath"

// MPSPipeDir is a GPU's CUDA_MPS_PIPE_DIRECTORY under the MPS root: <root>/<gpu-uuid>/pipe.
func MPSPipeDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "pipe") }

// MPSLogDir is a GPU's CUDA_MPS_LOG_DIRECTORY under the MPS root: <root>/<gpu-uuid>/log.
func MPSLogDir(mpsRoot, gpuUUID string) string { return filepath.Join(mpsRoot, gpuUUID, "log") }
