package gpu

import (
	"context"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// InstanceProcesses lists the compute processes running on MIG GPU instance giID of the GPU, read from
// its MIG device handles: the agent destroys an instance created for a claim only once none remain.
func (n *NVML) InstanceProcesses(ctx context.Context, uuid string, giID int) ([]Process, error) {
	h, err := n.handle(uuid)
	if err != nil {
		return nil, err
	}
	var out []Process
	err = eachMIGDevice(h, func(mig nvml.Device, gi int) error {
		if gi != giID {
			return nil
		}
		procs, r := mig.GetComputeRunningProcesses()
		if err := check("MIG GetComputeRunningProcesses", r); err != nil {
			return err
		}
		for _, p := range procs {
			out = append(out, Process{PID: int32(p.Pid), UsedMemory: p.UsedGpuMemory})
		}
		return nil
	})
	return out, err
}
