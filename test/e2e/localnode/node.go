// Package localnode runs a real single-node Kubernetes v1.36 on this machine for the e2e: etcd and
// kube-apiserver (through envtest), kube-controller-manager, kube-scheduler, containerd 2 with runc and
// the CNI bridge, and the kubelet, all built from the Go module proxy into bin/ (make e2e-deps). Servers
// listen on loopback only. Down stops everything and removes every process, mount, cgroup and network
// link the run made, and Leftovers proves it.
package localnode

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Options say where the node runs and what it carries.
type Options struct {
	// Root holds every file of the run (certificates, etcd, containerd, logs). It is removed by Down.
	Root string
	// Bin holds the binaries make e2e-deps builds.
	Bin string
	// Name is the node's name.
	Name string
	// Labels are the node's labels (the kubelet registers them).
	Labels map[string]string
	// Images are OCI archives to import before the kubelet starts.
	Images []string
	// GPUs is how many stand-in GPUs the node has: device nodes under Root/GPUDir that the RuntimeClass
	// nvidia's handler, NVIDIA's container runtime, hands to containers.
	GPUs int
}

// Node is a running single-node cluster.
type Node struct {
	Options
	// Config is the admin's client configuration; Kubeconfig is the same as a file, for kubectl.
	Config     *rest.Config
	Kubeconfig string
	// CAFile is the API server's CA.
	CAFile string
	// ContainerdSocket is containerd's gRPC address.
	ContainerdSocket string

	env               *envtest.Environment
	procs             []*proc
	containerd        *proc
	kubelet           *proc
	kubeletKubeconfig string
	logs              []io.Closer
	lock              *os.File
}

// LockFile is held (flock) by the run that owns the machine's node.
const LockFile = "/run/gpusharing-e2e.lock"

// NodeIP is the node's address. The kubelet refuses a loopback one, so the run adds this private address
// to lo: like loopback, nothing outside this machine can reach it, and Down removes it. The kubelet
// listens there (the API server reaches it for logs), and so do hostNetwork pods' probed ports.
const NodeIP = "10.254.254.1"

// marker names a directory as this package's, so a leftover of a killed run can be cleaned and anything
// else is refused.
const marker = ".gpusharing-e2e"

// HostDirs are the host directories the node and the operator's DaemonSet write outside Root, as on a
// real node; Down removes them.
var HostDirs = []string{KubeletRoot, "/run/gpusharing", "/usr/lib/gpusharing", PodLogs, "/var/log/containers"}

// CDISpecs are the CDI specs the agent's DRA kubelet plugin writes; teardown removes them, and only them
// (other drivers' specs may share the directory).
const CDISpecs = "/run/cdi/gpusharing.io-*"

// PodLogs is where the kubelet writes container logs; Down keeps a copy of them with the components'.
const PodLogs = "/var/log/pods"

// Up starts the node and waits until it is Ready.
func Up(ctx context.Context, o Options) (*Node, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the real-node e2e runs a kubelet and containers: it must run as root")
	}
	// A kubelet directory that is not ours means a real node: never run over it.
	for _, d := range []string{o.Root, KubeletRoot} {
		if _, err := os.Stat(d); err == nil {
			if _, err := os.Stat(filepath.Join(d, marker)); err != nil {
				return nil, fmt.Errorf("%s exists and is not a previous e2e run's: refusing to run a kubelet over it", d)
			}
		}
	}
	// One node per machine: a second run would take the first one's leftovers for a killed run's and clear
	// them under it. The lock is the process's: it goes when the run ends, however it ends.
	lock, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("another e2e run holds %s: one real node per machine", LockFile)
	}
	n := &Node{Options: o, lock: lock}
	// A run killed before its Down left its processes and mounts: clear them first.
	if err := n.cleanup(); err != nil {
		return nil, fmt.Errorf("clearing a previous run: %w", err)
	}
	for _, d := range []string{o.Root, KubeletRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(d, marker), nil, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(o.Root, "logs"), 0o755); err != nil {
		return nil, err
	}
	if err := n.up(ctx); err != nil {
		return n, err
	}
	return n, nil
}

func (n *Node) up(ctx context.Context) error {
	if out, err := exec.Command("ip", "addr", "add", NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("adding the node address %s to lo: %v: %s", NodeIP, err, out)
	}
	if err := n.startControlPlane(ctx); err != nil {
		return err
	}
	if err := sharedMount("/run/gpusharing"); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	for _, img := range n.Images {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	return n.WaitReady(ctx, 2*time.Minute)
}

// WaitReady waits until the Node object reports Ready.
func (n *Node) WaitReady(ctx context.Context, timeout time.Duration) error {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return err
	}
	return waitFor(ctx, "node "+n.Name+" Ready", n.kubelet, timeout, func() error {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node condition Ready=%s: %s", c.Status, c.Message)
			}
		}
		return fmt.Errorf("no Ready condition yet")
	})
}

// LogDir is where every component's log is.
func (n *Node) LogDir() string { return filepath.Join(n.Root, "logs") }

func (n *Node) logFile(name string) io.Writer {
	f, err := os.OpenFile(filepath.Join(n.Root, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return io.Discard
	}
	n.logs = append(n.logs, f)
	return f
}

func (n *Node) labels() string {
	var parts []string
	for k, v := range n.Labels {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// sharedMount makes dir a shared mount of its own. The agent's MPS root (under /run/gpusharing) is
// mounted Bidirectional, so that the /dev/shm tmpfs the agent mounts for each MPS GPU reaches the host and
// its pods, and the container runtime refuses Bidirectional on a host path whose mount is not shared. A
// systemd host's / is shared; this machine's is private. Down unmounts it with the run's other mounts.
func sharedMount(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s onto itself: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	return nil
}
