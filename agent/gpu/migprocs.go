package gpu

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// InstanceProcesses lists the compute processes running on MIG GPU instance giID of the GPU, read from
// its MIG device handles: the agent destroys an instance created for a claim only once none remain.
func (n *NVML) InstanceProcesses(ctx context.Context, uuid string, giID int) ([]Process, error) {
	h, err := n.handle(uuid)
	if err != nil {
		return nil, err
	}
	count, r := h.GetMaxMigDeviceCount()
	if err := check("GetMaxMigDeviceCount", r); err != nil {
		return nil, err
	}
	var out []Process
	for i := 0; i < count; i++ {
		mig, r := h.GetMigDeviceHandleByIndex(i)
		if r == nvml.ERROR_NOT_FOUND || r == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if err := check(fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", i), r); err != nil {
			return nil, err
		}
		gi, r := mig.GetGpuInstanceId()
		if err := check("GetGpuInstanceId", r); err != nil {
			return nil, err
		}
		if gi != giID {
			continue
		}
		procs, r := mig.GetComputeRunningProcesses()
		if err := check("MIG GetComputeRunningProcesses", r); err != nil {
			return nil, err
		}
		for _, p := range procs {
			out = append(out, Process{PID: int32(p.Pid), UsedMemory: p.UsedGpuMemory})
		}
	}
	return out, nil
}
