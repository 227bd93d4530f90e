package share

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Environment variables ContainerEdits sets. The GPUSHARE_* names are the ones shim/src/config.c reads.
const (
	EnvNvidiaVisibleDevices   = "NVIDIA_VISIBLE_DEVICES"
	EnvCUDAVisibleDevices     = "CUDA_VISIBLE_DEVICES"
	EnvMPSPipeDirectory       = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSActiveThreadPercent = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedMemLimit      = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvLDPreload              = "LD_PRELOAD"
	EnvShimSocket             = "GPUSHARE_SOCKET"
	EnvShimGPUUUID            = "GPUSHARE_GPU_UUID"
	EnvShimOversub            = "GPUSHARE_OVERSUB"
	EnvShimMemoryLimit        = "GPUSHARE_MEMORY_LIMIT_BYTES"
	EnvShimIdleMS             = "GPUSHARE_IDLE_MS"
	EnvShimIdleUS             = "GPUSHARE_IDLE_US"
	EnvMPSClientPriority      = "CUDA_MPS_CLIENT_PRIORITY"
)

var (
	// ErrDevicesSpanGPUs is returned when one container gets MPS shares of more than one GPU: an MPS
	// client connects to one control daemon, which serves one GPU, and shares /dev/shm with it, which
	// is a tmpfs of that GPU alone.
	ErrDevicesSpanGPUs = errors.New("MPS shares of more than one GPU in one container")
	// ErrSharesOnOneGPU is returned when one container gets two fixed shim shares of one GPU: a
	// container's shares are that many GPUs, and its processes take each GPU's lock as one client, so
	// a second share of the same GPU would keep another pod off it and give this one nothing. It comes
	// when the node has fewer GPUs with a free share than the container asks for.
	ErrSharesOnOneGPU = errors.New("two shim shares of one GPU in one container")
	// ErrTooManyShimGPUs is returned when one container gets shim shares of more GPUs than the shim
	// serves in one process (MaxShimGPUs): it would leave the GPUs past the limit unshared, their
	// calls passing through with no lock and no memory limit (docs/multigpu.md).
	ErrTooManyShimGPUs = errors.New("shim shares of more GPUs than the shim serves in one process")
	// ErrNoDevices is returned for a container request without device IDs.
	ErrNoDevices = errors.New("no devices requested")
)

// ContainerEdits is what one container gets for devs, all of one kind: device nodes (Devices, when
// cfg.Nodes is set), environment and mounts. The device plugin's Allocate answers with it and the DRA
// kubelet plugin writes the same nodes, environment and mounts into its CDI specs, so the two
// interfaces follow one rule.
func ContainerEdits(cfg Config, devs []Device) (*pluginapi.ContainerAllocateResponse, error) {
	return containerResponse(cfg.WithDefaults(), devs)
}

// containerResponse builds what one container needs for its devices, all of one resource. It is pure so
// that every field can be pinned by table tests.
func containerResponse(cfg Config, devs []Device) (*pluginapi.ContainerAllocateResponse, error) {
	if len(devs) == 0 {
		return nil, ErrNoDevices
	}
	visible := uniqueVisible(devs)
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{
		EnvNvidiaVisibleDevices: strings.Join(visible, ","),
		EnvCUDAVisibleDevices:   strings.Join(visible, ","),
	}}
	kind := devs[0].Kind
	for _, d := range devs[1:] {
		if d.Kind != kind {
			return nil, fmt.Errorf("devices %s and %s are of different kinds (%s, %s)", devs[0].ID, d.ID, kind, d.Kind)
		}
	}
	if cfg.Nodes != nil {
		// The share's device nodes are what gives the container its GPU; the variables above only tell
		// CUDA and the NVIDIA runtime inside which of them to use.
		nodes, err := DeviceNodes(cfg.Nodes, devs)
		if err != nil {
			return nil, err
		}
		resp.Devices = DeviceSpecs(nodes)
	}
	switch kind {
	case KindMPS:
		if len(visible) != 1 {
			return nil, fmt.Errorf("%w (%s): use one container per GPU, or shim shares", ErrDevicesSpanGPUs, strings.Join(visible, ", "))
		}
		addMPS(cfg, resp, devs)
	case KindShared:
		gpus := byGPU(devs)
		if len(gpus) > MaxShimGPUs {
			return nil, fmt.Errorf("%w: %d GPUs, at most %d; split the work over several containers, or ask for time-sliced shares "+
				"without the shim (%s, DeviceClass gpusharing-timeslicing) or whole GPUs (%s, DeviceClass gpusharing-exclusive)",
				ErrTooManyShimGPUs, len(gpus), MaxShimGPUs, cfg.Resources.TimeSlicing, cfg.Resources.Exclusive)
		}
		for _, g := range gpus {
			if fixed := len(g.devs) - countSized(g.devs); fixed > 1 {
				return nil, fmt.Errorf("%w: %d shares of %s; a container's shares must each be on their own GPU, and this node has too few GPUs with a free share", ErrSharesOnOneGPU, fixed, g.uuid)
			}
		}
		if len(gpus) == 1 {
			addShim(cfg, resp, devs)
		} else {
			addShimGPUs(cfg, resp, gpus)
		}
	}
	return resp, nil
}

// addMPS connects the container to its GPU's MPS daemon. Several shares of one GPU in one container add
// up: the container is one MPS client with the sum of the shares' thread percentages and memory limits.
func addMPS(cfg Config, resp *pluginapi.ContainerAllocateResponse, devs []Device) {
	d := devs[0]
	var atp int32
	var memMiB, limit int64
	for _, x := range devs {
		if x.MPS != nil {
			atp += x.MPS.ActiveThreadPercentage
			memMiB += x.MPS.PinnedMemoryLimitMiB
		}
		limit += x.MemoryLimitBytes
	}
	pipe, shm := mpsDirs(cfg, d)
	resp.Mounts = append(resp.Mounts, &pluginapi.Mount{
		ContainerPath: ContainerMPSPipeDir,
		HostPath:      pipe,
		// Clients write to the daemon's pipes, so the directory is mounted read-write.
		ReadOnly: false,
	}, &pluginapi.Mount{
		// The client and the daemon exchange work through shared memory: the container's /dev/shm is
		// its daemon's, a size-capped tmpfs of that daemon alone (agent/mps).
		ContainerPath: ContainerShm,
		HostPath:      shm,
	})
	resp.Envs[EnvMPSPipeDirectory] = ContainerMPSPipeDir
	if d.Opportunistic {
		// Opportunistic work on a GPU with production classes: the MPS server runs production's kernels
		// first (priority 1 is "below normal"), and the policy may cap its share of the SMs further.
		resp.Envs[EnvMPSClientPriority] = "1"
		if q := d.QoS; q != nil && q.OpportunisticThreadPercentage != nil {
			if capped := *q.OpportunisticThreadPercentage; atp <= 0 || capped < atp {
				atp = capped
			}
		}
	}
	if atp > 0 {
		resp.Envs[EnvMPSActiveThreadPercent] = strconv.Itoa(int(min(atp, 100)))
	}
	if memMiB > 0 {
		// The container sees exactly one GPU, so it is device ordinal 0 for the client.
		resp.Envs[EnvMPSPinnedMemLimit] = fmt.Sprintf("0=%dM", memMiB)
	}
	if limit > 0 && cfg.ShimLibrary != "" {
		// A sized claim: the MPS server holds the client to its pinned limit, but reports the whole GPU
		// as total to cudaMemGetInfo and NVML, which frameworks size their pools from. The shim, with no
		// scheduler socket, holds the same limit and reports it as the GPU's memory (measured on the
		// H100: docs/dra.md); the lock stays off, MPS shares the GPU.
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: ContainerShimLibrary, HostPath: cfg.ShimLibrary, ReadOnly: true})
		resp.Envs[EnvLDPreload] = ContainerShimLibrary
		resp.Envs[EnvShimMemoryLimit] = strconv.FormatInt(limit, 10)
	}
}

// mpsDirs are the host pipe directory and /dev/shm of the daemon an MPS device connects to: its
// namespace's daemon on the GPU where the device names one (DRA), else the GPU's (the device plugin).
// Everything a tenant can write to its daemon is in these two directories, so a container gets only its
// own namespace's.
func mpsDirs(cfg Config, d Device) (pipe, shm string) {
	if d.MPSNamespace != "" {
		return cfg.MPSTenantPipeDir(d.GPUUUID, d.MPSNamespace), cfg.MPSTenantShmDir(d.GPUUUID, d.MPSNamespace)
	}
	return cfg.MPSPipeDir(d.GPUUUID), cfg.MPSShmDir(d.GPUUUID)
}

// addShim preloads libgpushare.so and points it at the GPU's scheduler socket. Sized shares of one GPU
// in one container add up, as MPS shares do: one limit of their sum for each of its processes.
func addShim(cfg Config, resp *pluginapi.ContainerAllocateResponse, devs []Device) {
	d := devs[0]
	var limit int64
	for _, x := range devs {
		limit += x.MemoryLimitBytes
	}
	sock := cfg.SchedulerSocketPath(d.GPUUUID)
	resp.Mounts = append(resp.Mounts,
		&pluginapi.Mount{ContainerPath: ContainerShimLibrary, HostPath: cfg.ShimLibrary, ReadOnly: true},
		// The directory rather than the socket: a restarted scheduler re-creates the socket file, which a
		// bind mount of the old file would not show. Connecting to a socket works on a read-only mount.
		&pluginapi.Mount{ContainerPath: ContainerSchedulerDir, HostPath: filepath.Dir(sock), ReadOnly: true},
	)
	resp.Envs[EnvLDPreload] = ContainerShimLibrary
	resp.Envs[EnvShimSocket] = filepath.Join(ContainerSchedulerDir, filepath.Base(sock))
	resp.Envs[EnvShimGPUUUID] = d.GPUUUID
	// Neither GPUSHARE_QUANTUM_MS nor GPUSHARE_BUDGET_BYTES: the scheduler hands the quantum out with
	// every grant and the budget at hello, and the agent changes both in place when the policy does.
	// Either variable only lowers what the scheduler says, so set here it would pin a pod to the values
	// in force when it was admitted and a later raise would never reach it.
	if d.ShimOversub {
		resp.Envs[EnvShimOversub] = "1"
	}
	// No GPUSHARE_IDLE_MS either: on a GPU with production classes the scheduler tells production
	// processes a short idle window itself (scheduler.ProductionIdle), as only it knows which pod a
	// process belongs to; opportunistic ones keep the shim's default.
	if limit > 0 {
		// Unlike the quantum and the budget, a claim's size is fixed for its life: the shim reads it once.
		resp.Envs[EnvShimMemoryLimit] = strconv.FormatInt(limit, 10)
	}
}

// uniqueVisible lists the distinct uuids of devs in order: two replicas of one GPU name it once.
func uniqueVisible(devs []Device) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range devs {
		if !seen[d.VisibleUUID] {
			seen[d.VisibleUUID] = true
			out = append(out, d.VisibleUUID)
		}
	}
	return out
}
