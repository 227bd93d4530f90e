// Package share is what one GPU share is, for both of the agent's interfaces to the kubelet: the
// devices a node's applied sharing offers (DevicesFromStatus: whole GPUs, replicas, MPS clients, MIG
// instances, shim shares), the limits each carries (MPS thread and memory limits, the shim's memory
// limit) and the container edits that hand one out (ContainerEdits: device nodes, environment and
// mounts). The device plugin advertises and allocates these devices; the DRA driver publishes and
// prepares them. It depends on the API, on host paths and on the host's device nodes only, so neither
// plugin's code decides what the other gives.
package share

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpusharing/gpusharing/agent/hostpath"
)

// ResourceName is an extended resource name a pod requests, for example nvidia.com/gpu.
type ResourceName string

// Paths inside the container. They are fixed so that images and docs can rely on them; only the host
// side of each mount is configurable.
const (
	// ContainerMPSPipeDir is where a GPU's MPS pipe directory is mounted (CUDA_MPS_PIPE_DIRECTORY).
	ContainerMPSPipeDir = "/var/run/gpusharing/mps"
	// ContainerShm is where an MPS client sees its GPU's daemon's shared memory (the GPU's tmpfs).
	ContainerShm = "/dev/shm"
	// ContainerShimLibrary is where libgpushare.so is mounted (LD_PRELOAD).
	ContainerShimLibrary = "/usr/lib/gpusharing/libgpushare.so"
	// ContainerSchedulerDir is where the GPU's scheduler socket directory is mounted.
	ContainerSchedulerDir = "/var/run/gpusharing/scheduler"
	// SchedulerSocketName is the file name of a GPU's scheduler socket in its directory (hostpath's).
	SchedulerSocketName = hostpath.SchedulerSocketName
)

// ResourceNames are the extended resources the plugin advertises. The defaults keep pod specs that ask
// for nvidia.com/gpu or nvidia.com/mig-<profile> working and make every kind of sharing an explicit opt-in.
type ResourceNames struct {
	// Exclusive is a whole GPU for one container (default nvidia.com/gpu).
	Exclusive ResourceName
	// TimeSlicing is one replica of a time-sliced GPU (default gpusharing.io/gpu-timeslice).
	TimeSlicing ResourceName
	// MPS is one MPS client share of a GPU (default gpusharing.io/gpu-mps).
	MPS ResourceName
	// Shared is one share of a GPU scheduled by the shim's lock (default gpusharing.io/gpu-shared).
	Shared ResourceName
	// MIGPrefix is prepended to a MIG profile name (default nvidia.com/mig-, giving nvidia.com/mig-1g.10gb).
	MIGPrefix string
}

// Config says what the plugin advertises and where it finds the kubelet and the host paths it mounts.
// Zero fields take the defaults of DefaultConfig.
type Config struct {
	Resources ResourceNames
	// SocketDir is the kubelet's device plugin directory; kubelet.sock lives there and so do the plugin sockets.
	SocketDir string
	// MPSRoot holds one directory per MPS GPU: <MPSRoot>/<gpu-uuid>/pipe, .../log and .../shm (see MPSPipeDir).
	MPSRoot string
	// SchedulerRoot holds one directory per shim-shared GPU with its scheduler socket (see SchedulerSocketPath).
	SchedulerRoot string
	// ShimLibrary is the host path of libgpushare.so, mounted read-only into shim-shared containers.
	ShimLibrary string
	// ShimReplicas is how many shares an Exclusive GPU with oversubscription (the shim) is cut into; the API
	// has no replica count for that case. A TimeSlicing GPU with the shim uses its time-slice replicas.
	ShimReplicas int32
	// Nodes reads the NVIDIA device nodes every container with a share gets (devnodes.Host); nil hands
	// out no device nodes, only the environment, for nodes whose runtime injects the GPUs itself (the
	// demo's simulated nodes).
	Nodes NodeReader
	// CDIDir is where the device plugin writes the CDI spec of its devices (gpusharing.io/device, with
	// their device nodes) and Allocate names them; empty names none (Devices still carries the nodes).
	CDIDir string
	// KubeletPollInterval is how often the Manager checks kubelet.sock for a kubelet restart.
	KubeletPollInterval time.Duration
	// RegisterTimeout bounds one Register call to the kubelet.
	RegisterTimeout time.Duration
}

// DefaultConfig is the configuration of a standard node.
func DefaultConfig() Config {
	return Config{
		Resources: ResourceNames{
			Exclusive:   "nvidia.com/gpu",
			TimeSlicing: "gpusharing.io/gpu-timeslice",
			MPS:         "gpusharing.io/gpu-mps",
			Shared:      "gpusharing.io/gpu-shared",
			MIGPrefix:   "nvidia.com/mig-",
		},
		SocketDir:           strings.TrimSuffix(pluginapi.DevicePluginPath, "/"),
		MPSRoot:             "/run/gpusharing/mps",
		SchedulerRoot:       "/run/gpusharing/scheduler",
		ShimLibrary:         "/var/lib/gpusharing/lib/libgpushare.so",
		ShimReplicas:        4,
		KubeletPollInterval: time.Second,
		RegisterTimeout:     5 * time.Second,
	}
}

// WithDefaults returns c with every zero field set from DefaultConfig.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	r := &c.Resources
	for _, f := range []struct {
		v   *ResourceName
		def ResourceName
	}{{&r.Exclusive, d.Resources.Exclusive}, {&r.TimeSlicing, d.Resources.TimeSlicing}, {&r.MPS, d.Resources.MPS}, {&r.Shared, d.Resources.Shared}} {
		if *f.v == "" {
			*f.v = f.def
		}
	}
	setString(&r.MIGPrefix, d.Resources.MIGPrefix)
	setString(&c.SocketDir, d.SocketDir)
	setString(&c.MPSRoot, d.MPSRoot)
	setString(&c.SchedulerRoot, d.SchedulerRoot)
	setString(&c.ShimLibrary, d.ShimLibrary)
	if c.ShimReplicas <= 0 {
		c.ShimReplicas = d.ShimReplicas
	}
	if c.KubeletPollInterval <= 0 {
		c.KubeletPollInterval = d.KubeletPollInterval
	}
	if c.RegisterTimeout <= 0 {
		c.RegisterTimeout = d.RegisterTimeout
	}
	return c
}

func setString(v *string, def string) {
	if *v == "" {
		*v = def
	}
}

// KubeletSocket is the kubelet's registration socket.
func (c Config) KubeletSocket() string { return filepath.Join(c.SocketDir, "kubelet.sock") }

// MPSPipeDir is the host directory a GPU's MPS control daemon uses as CUDA_MPS_PIPE_DIRECTORY. The agent's
// MPS package starts the daemon with this directory so that the mount Allocate hands out reaches it.
func (c Config) MPSPipeDir(gpuUUID string) string { return hostpath.MPSPipeDir(c.MPSRoot, gpuUUID) }

// MPSShmDir is the host directory of a GPU's MPS tmpfs, which is /dev/shm for its daemon and its client
// containers (and for no other GPU's).
func (c Config) MPSShmDir(gpuUUID string) string { return hostpath.MPSShmDir(c.MPSRoot, gpuUUID) }

// MPSTenantPipeDir is the pipe directory of a namespace's MPS daemon on a GPU, which DRA mounts into that
// namespace's MPS clients of the GPU (and into no other).
func (c Config) MPSTenantPipeDir(gpuUUID, namespace string) string {
	return hostpath.MPSTenantPipeDir(c.MPSRoot, gpuUUID, namespace)
}

// MPSTenantShmDir is the /dev/shm tmpfs of a namespace's MPS daemon on a GPU, mounted like its pipe
// directory.
func (c Config) MPSTenantShmDir(gpuUUID, namespace string) string {
	return hostpath.MPSTenantShmDir(c.MPSRoot, gpuUUID, namespace)
}

// MPSLogDir is the host directory for a GPU's MPS daemon logs (CUDA_MPS_LOG_DIRECTORY); never mounted into pods.
func (c Config) MPSLogDir(gpuUUID string) string { return hostpath.MPSLogDir(c.MPSRoot, gpuUUID) }

// SchedulerSocketPath is the host path of a GPU's shim scheduler socket (the scheduler's GPUConfig.SocketPath).
// Its directory, not the socket, is mounted into pods, so a restarted scheduler's new socket is seen.
func (c Config) SchedulerSocketPath(gpuUUID string) string {
	return hostpath.SchedulerSocket(c.SchedulerRoot, gpuUUID)
}

// MIGResource is the resource name of a MIG profile. A '+' (as in 1g.10gb+me) is not allowed in a
// resource name, so it becomes '.': nvidia.com/mig-1g.10gb.me.
func (c Config) MIGResource(profile string) ResourceName {
	return ResourceName(c.Resources.MIGPrefix + strings.ReplaceAll(profile, "+", "."))
}

// ErrInvalidConfig wraps every error Validate returns.
var ErrInvalidConfig = errors.New("invalid device plugin configuration")

// Validate checks that every resource name is a valid extended resource name (domain/name, outside the
// kubernetes.io domains), that MIG names built from the prefix are valid, and that no two kinds share a
// name: a resource serves one kind, whose Allocate answer differs from the others'.
func (c Config) Validate() error {
	c = c.WithDefaults()
	r := c.Resources
	seen := map[ResourceName]string{}
	for _, n := range []struct {
		kind string
		name ResourceName
	}{{"exclusive", r.Exclusive}, {"time-slicing", r.TimeSlicing}, {"MPS", r.MPS}, {"shared", r.Shared}, {"MIG (for profile 1g.10gb+me)", c.MIGResource("1g.10gb+me")}} {
		if err := validateResourceName(n.name); err != nil {
			return fmt.Errorf("%w: %s resource %q: %v", ErrInvalidConfig, n.kind, n.name, err)
		}
		if other, ok := seen[n.name]; ok {
			return fmt.Errorf("%w: %s and %s resources are both named %q", ErrInvalidConfig, other, n.kind, n.name)
		}
		seen[n.name] = n.kind
	}
	for _, n := range []ResourceName{r.Exclusive, r.TimeSlicing, r.MPS, r.Shared} {
		if strings.HasPrefix(string(n), r.MIGPrefix) {
			return fmt.Errorf("%w: resource %q starts with the MIG prefix %q and could collide with a MIG profile", ErrInvalidConfig, n, r.MIGPrefix)
		}
	}
	return nil
}

func validateResourceName(n ResourceName) error {
	s := string(n)
	domain, _, ok := strings.Cut(s, "/")
	if !ok {
		return errors.New("want domain/name")
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || strings.HasPrefix(s, "requests.") {
		return errors.New("the kubernetes.io domains and the requests. prefix are reserved")
	}
	if errs := validation.IsQualifiedName(s); len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}
