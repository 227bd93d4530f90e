//go:build e2e

// Package e2e installs gpusharing as users do — its own images, `kubectl apply -k` of an overlay of
// config/default — on a real single-node Kubernetes (test/e2e/localnode: kubelet, containerd, runc,
// kube-scheduler, kube-controller-manager, kube-apiserver, etcd) and drives it with real pods.
// Run it with make e2e (root, Linux); docs/e2e.md says what each scenario proves.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/e2e/localnode"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// NodeName is the e2e node; its agent simulates a DGX H100 with 8 GPUs.
const NodeName = "gpu-node-1"

var node *localnode.Node

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) (code int) {
	root := testenv.RepoRoot()
	bin := os.Getenv("E2E_BIN")
	if bin == "" {
		bin = filepath.Join(root, "bin")
	}
	images := filepath.Join(bin, "images")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	n, err := localnode.Up(ctx, localnode.Options{
		Root:   "/tmp/gpusharing-e2e",
		Bin:    bin,
		Name:   NodeName,
		Labels: map[string]string{"nvidia.com/gpu.present": "true"},
		GPUs:   8,
		Images: []string{filepath.Join(images, "pause.tar"), filepath.Join(images, "busybox.tar"),
			filepath.Join(images, "manager.tar"), filepath.Join(images, "agent.tar"), filepath.Join(images, "shim-worker.tar")},
	})
	if n == nil {
		// Nothing was brought up (another run holds the node): nothing of ours to tear down, and the
		// logs folder is that run's.
		fmt.Fprintln(os.Stderr, "e2e: bringing the node up:", err)
		return 1
	}
	logs := filepath.Join(root, "test", "e2e", "logs")
	_ = os.RemoveAll(logs)
	defer func() {
		if os.Getenv("E2E_KEEP") != "" {
			fmt.Println("e2e: E2E_KEEP set: the node stays up for inspection; kubeconfig", n.Kubeconfig, "(the next run clears it)")
			return
		}
		if err := n.Down(logs); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: teardown:", err)
			code = 1
		}
		if left := n.Leftovers(); len(left) > 0 {
			fmt.Fprintln(os.Stderr, "e2e: the run left these behind:")
			for _, l := range left {
				fmt.Fprintln(os.Stderr, "  ", l)
			}
			code = 1
		} else {
			fmt.Println("e2e: teardown left no process, mount, cgroup, link or directory behind; logs in", logs)
		}
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: bringing the node up:", err)
		return 1
	}
	if err := n.TagImage(ctx, BusyboxImage, ExampleImage); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: naming busybox as examples/pods' image:", err)
		return 1
	}
	fmt.Printf("e2e: node %s Ready in %s (kubeconfig %s)\n", NodeName, time.Since(start).Round(time.Second), n.Kubeconfig)
	node = n
	return m.Run()
}
