package localnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// containerdConfig is containerd 2.x's configuration (version 3) for the e2e node: its own root, state and
// socket under the run's directory, runc from bin/ with cgroupfs (this host has no systemd), NVIDIA's
// container runtime (over the same runc) as the handler nvidia, the CNI plugins and a bridge network from bin/cni, network namespaces under the state directory (so teardown
// finds every mount under one root), CDI on, OOM scores no lower than containerd's, and the locally
// built pause image as the pod sandbox.
const containerdConfig = `version = 3
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[4]q
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # This host withholds CAP_SYS_RESOURCE, so no process may lower its OOM score: pods get at least
  # containerd's own (the pause container's -998 would be refused and no pod would start).
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = %[5]q
      SystemdCgroup = false
  # The handler the RuntimeClass nvidia names (config/runtimeclass): NVIDIA's container runtime in CDI
  # mode over the node's stand-in GPUs (gpus.go), as on a GPU node.
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
      BinaryName = %[8]q
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q
`

// cniConfig is a bridge network on 10.88.0.0/16 (host-local addresses kept under the run's directory).
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "e2e",
  "plugins": [
    {"type": "bridge", "bridge": %[1]q, "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": %[2]q, "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
`

// BridgeName is the CNI bridge teardown removes.
const BridgeName = "gpushare-e2e0"

// PauseImage is the pod sandbox image make images builds.
const PauseImage = "gpusharing.io/e2e/pause:1"

func (n *Node) startContainerd(ctx context.Context) error {
	dir := filepath.Join(n.Root, "containerd")
	netd := filepath.Join(n.Root, "cni", "net.d")
	for _, d := range []string{dir, netd} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	n.ContainerdSocket = filepath.Join(dir, "containerd.sock")
	nvidia, err := n.setupGPUs()
	if err != nil {
		return fmt.Errorf("the stand-in GPUs and NVIDIA's container runtime: %w", err)
	}
	conf := filepath.Join(dir, "config.toml")
	body := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.ContainerdSocket,
		PauseImage, filepath.Join(n.Bin, "runc"), filepath.Join(n.Bin, "cni"), netd, nvidia)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(cniConfig, BridgeName, filepath.Join(n.Root, "cni", "ipam"))
	if err := os.WriteFile(filepath.Join(netd, "10-e2e.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	p, err := n.start("containerd", filepath.Join(n.Bin, "containerd"), "--config", conf)
	if err != nil {
		return err
	}
	n.containerd = p
	return waitFor(ctx, "containerd serving", p, 60*time.Second, func() error {
		return n.ctr(ctx, "version")
	})
}

// ctr runs bin/ctr against this node's containerd in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(n.Bin, "ctr"), append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %v: %w: %s", args, err, out)
	}
	return nil
}

// ImportImage loads an OCI archive (make images) into containerd, where the kubelet finds it: pods name
// the image and never pull.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	return n.ctr(ctx, "images", "import", "--platform", "linux/amd64", archive)
}

// TagImage gives an imported image a second name, as pushing a new tag to a registry would.
func (n *Node) TagImage(ctx context.Context, from, to string) error {
	return n.ctr(ctx, "images", "tag", "--force", from, to)
}
