package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/runner"
)

// sizedNode is the simulated node whose GPUs 4-7 the sized sample policy sizes per claim.
const sizedNode = "dgx-a100-c"

// sizedWorkloads are three notebooks of different sizes, each a pod with a claim of the DeviceClass
// gpusharing-sized: the real kube-scheduler packs them onto one A100 (34 of its 40Gi).
var sizedWorkloads = []struct{ name, memory, compute string }{
	{"notebook-small", "4Gi", "10"},
	{"notebook-medium", "10Gi", "30"},
	{"notebook-large", "20Gi", "50"},
}

// scheduleSizedClaims runs the real kube-scheduler, lets it allocate the sized workloads' claims from
// the agents' ResourceSlices and prints where each landed with its size. The node is marked Ready as a
// kubelet would, and its stand-in kubelet (simnode.Kubelet) prepares the claims through the agent's DRA
// plugin, so the GPUNode lists them (memory allocated in the wide table).
func (c *cluster) scheduleSizedClaims(ctx context.Context, w io.Writer) error {
	if err := c.startScheduler(); err != nil {
		return err
	}
	if _, err := c.env.ReadyNode(ctx, sizedNode); err != nil {
		return err
	}
	for _, s := range sizedWorkloads {
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: s.name},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
				Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized", Capacity: &resourcev1.CapacityRequirements{
					Requests: map[resourcev1.QualifiedName]resource.Quantity{
						dra.CapacityMemory: resource.MustParse(s.memory), dra.CapacityCompute: resource.MustParse(s.compute)}}}}}}}}
		if err := c.env.Client.Create(ctx, claim); err != nil {
			return fmt.Errorf("claim %s: %w", s.name, err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: s.name},
			Spec: corev1.PodSpec{
				NodeSelector:   map[string]string{"pool": "notebooks"},
				Containers:     []corev1.Container{{Name: "notebook", Image: "jupyter", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			}}
		if err := c.env.Client.Create(ctx, pod); err != nil {
			return fmt.Errorf("pod %s: %w", s.name, err)
		}
	}
	if err := c.waitAllocated(ctx); err != nil {
		return err
	}
	cols := "CLAIM:.metadata.name,DEVICE:.status.allocation.devices.results[0].device,MEMORY:.status.allocation.devices.results[0].consumedCapacity.memory,COMPUTE:.status.allocation.devices.results[0].consumedCapacity.compute,NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0]"
	res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: c.kubectl, Args: []string{"--kubeconfig", c.kubeconfig, "get", "resourceclaims", "-o", "custom-columns=" + cols}})
	if _, werr := fmt.Fprint(w, "\n$ kubectl get resourceclaims -o custom-columns=...\n", res.Stdout, res.Stderr); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("kubectl get resourceclaims: %w", err)
	}
	return nil
}

// waitAllocated waits (bounded) until the scheduler has allocated every sized workload's claim.
func (c *cluster) waitAllocated(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var pending []string
		for _, s := range sizedWorkloads {
			claim := &resourcev1.ResourceClaim{}
			if err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: s.name}, claim); err != nil || claim.Status.Allocation == nil {
				pending = append(pending, s.name)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the scheduler did not allocate %s within a minute; kube-scheduler's log ends:\n%s", strings.Join(pending, ", "), c.scheduler.LogTail(3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startScheduler runs the real kube-scheduler against the embedded API server, and kube-controller-manager's
// ResourceClaim controller, which makes the claims of pods' templates and deallocates those of deleted
// pods; stop ends them.
func (c *cluster) startScheduler() error {
	s, err := c.env.StartScheduler(c.dir)
	if err != nil {
		return err
	}
	c.scheduler = s
	if c.claimController, err = c.env.StartControllerManager(c.dir, "resourceclaim-controller"); err != nil {
		return err
	}
	return nil
}

// stopScheduler ends kube-scheduler, if started.
func (c *cluster) stopScheduler() {
	if c.scheduler != nil {
		c.scheduler.Stop()
	}
	if c.claimController != nil {
		c.claimController.Stop()
	}
	if c.appControllers != nil {
		c.appControllers.Stop()
	}
}
