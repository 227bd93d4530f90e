package localnode

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeletRoot is the kubelet's default root directory. The e2e keeps the defaults the agent's manifests
// mount (device-plugins/, pod-resources/), so the DaemonSet's host paths are tested as shipped.
const KubeletRoot = "/var/lib/kubelet"

// kubeletConfig: this host's cgroups are a v1 hybrid without systemd (failCgroupV1: false, cgroupfs); the
// kubelet serves on the node address only (NodeIP), where the API server reaches it for logs without a
// client certificate (anonymous, AlwaysAllow: nothing outside this machine can connect); eviction thresholds are low so a busy build machine
// does not evict the test pods; no swap check, no cluster DNS (pods use the host's resolv.conf).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
failSwapOn: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
registerNode: true
serializeImagePulls: false
syncFrequency: 5s
nodeStatusUpdateFrequency: 5s
fileCheckFrequency: 5s
`

func (n *Node) startKubelet(ctx context.Context) error {
	dir := filepath.Join(n.Root, "kubelet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	conf := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(kubeletConfig, n.ContainerdSocket, NodeIP)), 0o644); err != nil {
		return err
	}
	if n.kubeletKubeconfig == "" {
		kc, err := n.kubeconfig("kubelet", envtest.User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}})
		if err != nil {
			return err
		}
		n.kubeletKubeconfig = kc
	}
	p, err := n.start("kubelet", filepath.Join(n.Bin, "kubelet"),
		"--config="+conf, "--kubeconfig="+n.kubeletKubeconfig, "--root-dir="+KubeletRoot,
		"--cert-dir="+filepath.Join(dir, "pki"), "--hostname-override="+n.Name, "--node-ip="+NodeIP,
		"--node-labels="+n.labels(), "--v=2")
	if err != nil {
		return err
	}
	n.kubelet = p
	return waitFor(ctx, "kubelet healthz", p, 90*time.Second, func() error {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://127.0.0.1:10248/healthz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz: %s", resp.Status)
		}
		return nil
	})
}

// RestartKubelet stops the kubelet (SIGTERM, as systemd does) and starts it again; pods keep running.
func (n *Node) RestartKubelet(ctx context.Context) error {
	n.kubelet.stop(30 * time.Second)
	return n.startKubelet(ctx)
}

// KubeletLog returns the kubelet's log from byte offset from on, and the offset of its end: a test reads
// what the kubelet said after an event it caused.
func (n *Node) KubeletLog(from int64) (string, int64) {
	data, err := os.ReadFile(filepath.Join(n.LogDir(), "kubelet.log"))
	if err != nil || int64(len(data)) < from {
		return "", from
	}
	return string(data[from:]), int64(len(data))
}
