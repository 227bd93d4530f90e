package deviceplugin

import (
	"errors"

	"github.com/gpusharing/gpusharing/agent/share"
)

var (
	// ErrUnknownDevice is returned when the kubelet allocates a device this resource does not advertise
	// (for example one cordoned a moment ago).
	ErrUnknownDevice = errors.New("device not advertised")
	// ErrCordonedDevice is returned when the kubelet allocates a device of a GPU being drained, which is
	// advertised only while the pod that held it runs.
	ErrCordonedDevice = errors.New("device of a GPU cordoned for a drain")
)

// The plugin's configuration and the environment its Allocate sets are the share's (agent/share); these
// names keep them reachable for the callers that configure the plugin and check what it hands out.
type (
	// Config is share.Config: resource names, host paths and the plugin's kubelet settings.
	Config = share.Config
	// ResourceName is share.ResourceName.
	ResourceName = share.ResourceName
)

// DefaultConfig is share.DefaultConfig.
func DefaultConfig() Config { return share.DefaultConfig() }

// ReplicaID is share.ReplicaID.
func ReplicaID(gpuUUID string, n int32) string { return share.ReplicaID(gpuUUID, n) }

// Environment variables Allocate sets (share's).
const (
	EnvNvidiaVisibleDevices   = share.EnvNvidiaVisibleDevices
	EnvCUDAVisibleDevices     = share.EnvCUDAVisibleDevices
	EnvMPSPipeDirectory       = share.EnvMPSPipeDirectory
	EnvMPSActiveThreadPercent = share.EnvMPSActiveThreadPercent
	EnvMPSPinnedMemLimit      = share.EnvMPSPinnedMemLimit
	EnvLDPreload              = share.EnvLDPreload
	EnvShimMemoryLimit        = share.EnvShimMemoryLimit
)

