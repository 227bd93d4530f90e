package localnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/devnodes"
	"github.com/gpusharing/gpusharing/agent/devnodes/devnodestest"
)

// GPUDir is where, under Root, the node's stand-in GPUs live: dev/ with character devices of the NVIDIA
// driver's numbers (/dev/nvidia0..7 as 195:0..7, nvidiactl, nvidia-uvm, the MIG capability nodes), proc/
// with the devices and mig-minors files that list them, the CDI spec of every GPU the GPU Operator would
// write (cdi/), and NVIDIA's container runtime's configuration. The agent reads dev/ and proc/ as its
// --dev-root and --device-proc-root (config/e2e/node names this directory).
const GPUDir = "nvidia"

// nvidiaRuntimeConfig is the NVIDIA container runtime's config.toml: CDI mode, with the hardened setting
// that ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers unless acceptEnv, devices from the
// Operator-like spec, runc from bin/ underneath.
const nvidiaRuntimeConfig = `accept-nvidia-visible-devices-envvar-when-unprivileged = %[1]t
accept-nvidia-visible-devices-as-volume-mounts = false

[nvidia-container-cli]
root = %[2]q

[nvidia-container-runtime]
debug = %[3]q
log-level = "info"
mode = "cdi"
runtimes = [%[4]q]

[nvidia-container-runtime.modes.cdi]
default-kind = "nvidia.com/gpu"
spec-dirs = [%[5]q]
annotation-prefixes = ["cdi.k8s.io/"]
`

// AcceptEnvVar, when set in the environment of the run, turns the runtime's hardened setting off
// (E2E_NVIDIA_ACCEPT_ENVVAR=1): then a pod's own NVIDIA_VISIBLE_DEVICES=all gets it every GPU, which is
// what the DeviceNodes scenario shows the hardened setting prevents.
const AcceptEnvVar = "E2E_NVIDIA_ACCEPT_ENVVAR"

// setupGPUs makes the stand-in GPUs and returns the handler the RuntimeClass nvidia runs: a wrapper that
// starts bin/nvidia-container-runtime with its configuration.
func (n *Node) setupGPUs() (string, error) {
	dir := filepath.Join(n.Root, GPUDir)
	h, err := devnodestest.Make(dir, n.GPUs)
	if err != nil {
		return "", err
	}
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		return "", err
	}
	if err := writeOperatorSpec(h, n.GPUs, filepath.Join(specDir, "nvidia.json")); err != nil {
		return "", err
	}
	conf := filepath.Join(dir, "config.toml")
	body := fmt.Sprintf(nvidiaRuntimeConfig, os.Getenv(AcceptEnvVar) == "1", dir, filepath.Join(n.Root, "logs", "nvidia-container-runtime.log"),
		filepath.Join(n.Bin, "runc"), specDir)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return "", err
	}
	runtime := filepath.Join(n.Bin, "nvidia-container-runtime")
	if _, err := os.Stat(runtime); err != nil {
		return "", fmt.Errorf("%w (make e2e-deps builds it)", err)
	}
	wrapper := filepath.Join(dir, "nvidia-container-runtime")
	script := fmt.Sprintf("#!/bin/sh\nNVIDIA_CTK_CONFIG_FILE_PATH=%s exec %s \"$@\"\n", conf, runtime)
	return wrapper, os.WriteFile(wrapper, []byte(script), 0o755)
}

// writeOperatorSpec writes the CDI spec nvidia.com/gpu the GPU Operator's toolkit generates for a node:
// a device per GPU index and "all", each with the GPU's node, and the control and unified memory nodes
// for every device. A runtime that honours NVIDIA_VISIBLE_DEVICES=all injects nvidia.com/gpu=all.
func writeOperatorSpec(h devnodes.Host, gpus int, path string) error {
	ctl, err := h.Control()
	if err != nil {
		return err
	}
	node := func(n devnodes.Node) *cdispec.DeviceNode {
		return &cdispec.DeviceNode{Path: n.Path, HostPath: n.HostPath}
	}
	spec := cdispec.Spec{Kind: "nvidia.com/gpu"}
	all := cdispec.Device{Name: "all"}
	for i := 0; i < gpus; i++ {
		g, err := h.GPU(int32(i))
		if err != nil {
			return err
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: strconv.Itoa(i), ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node(g)}}})
		all.ContainerEdits.DeviceNodes = append(all.ContainerEdits.DeviceNodes, node(g))
	}
	spec.Devices = append(spec.Devices, all)
	for _, c := range ctl {
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, node(c))
	}
	v, err := cdispec.MinimumRequiredVersion(&spec)
	if err != nil {
		return err
	}
	spec.Version = v
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
