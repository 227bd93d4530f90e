package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// dynamicNode is the simulated node whose H100 takes MIG instances from claims (dynamic-mig sample).
const dynamicNode = "dgx-h100-f"

// dynamicWorkloads are pods whose ResourceClaimTemplate asks for one MIG profile each.
var dynamicWorkloads = []struct{ name, profile string }{
	{"train-3g", "3g.40gb"},
	{"infer-2g", "2g.20gb"},
	{"notebook-1g", "1g.10gb"},
}

// showDynamicMIG packs three workloads of three profiles onto the dynamic H100, shows a fourth that fits
// the free total but no free placement waiting, then deletes one workload: its instance is destroyed,
// its slices come back, and the waiting workload's instance is created there.
func (c *cluster) showDynamicMIG(ctx context.Context, w io.Writer) error {
	if _, err := c.env.ReadyNode(ctx, dynamicNode); err != nil {
		return err
	}
	for _, d := range dynamicWorkloads {
		if err := c.migWorkload(ctx, d.name, d.profile); err != nil {
			return err
		}
		if err := c.waitPod(ctx, d.name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }); err != nil {
			return err
		}
	}
	if err := c.printDynamic(ctx, w); err != nil {
		return err
	}
	say("A second 1g.10gb: memory slice 7 and one compute slice are free, but no 1g.10gb placement starts at 7")
	if err := c.migWorkload(ctx, "notebook-1g-b", "1g.10gb"); err != nil {
		return err
	}
	if err := c.waitPod(ctx, "notebook-1g-b", func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				_, _ = fmt.Fprintf(w, "pod notebook-1g-b: PodScheduled=False: %s\n", cond.Message)
				return true
			}
		}
		return false
	}); err != nil {
		return err
	}
	say("Deleting pod infer-2g: its claim is unprepared, the 2g.20gb instance destroyed, and slices 4-5 come back")
	if err := c.env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "infer-2g"}}); err != nil {
		return err
	}
	if err := c.waitPod(ctx, "notebook-1g-b", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }); err != nil {
		return err
	}
	return c.printDynamic(ctx, w)
}

// migWorkload creates a ResourceClaimTemplate for one MIG profile and a pod using it on the dynamic pool.
func (c *cluster) migWorkload(ctx context.Context, name, profile string) error {
	tmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-mig-dynamic", Selectors: []resourcev1.DeviceSelector{{
				CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.gpusharing.io"].migProfile == "` + profile + `"`}}}}}}}}}}
	if err := c.env.Client.Create(ctx, tmpl); err != nil {
		return fmt.Errorf("claim template %s: %w", name, err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{"pool": "dynamic"},
			Containers:     []corev1.Container{{Name: "main", Image: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}},
		}}
	if err := c.env.Client.Create(ctx, pod); err != nil {
		return fmt.Errorf("pod %s: %w", name, err)
	}
	return nil
}

// waitPod waits (bounded) until ok holds for the pod.
func (c *cluster) waitPod(ctx context.Context, name string, ok func(*corev1.Pod) bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var pod corev1.Pod
		if err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &pod); err == nil && ok(&pod) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s: %w", name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// printDynamic prints the dynamic node's row and its instances with their claims, as kubectl shows them.
func (c *cluster) printDynamic(ctx context.Context, w io.Writer) error {
	// The status follows the plugin's change on the agent's next pass; wait (bounded) until it lists
	// exactly the running workloads' instances.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var gn v1alpha1.GPUNode
		var pods corev1.PodList
		if err := c.env.Client.Get(wctx, client.ObjectKey{Name: dynamicNode}, &gn); err == nil && c.env.Client.List(wctx, &pods, client.InNamespace("default")) == nil {
			running := 0
			for _, p := range pods.Items {
				if p.Spec.NodeName == dynamicNode && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
					running++
				}
			}
			claimed := 0
			for _, g := range gn.Status.GPUs {
				if g.Applied != nil {
					for _, in := range g.Applied.MIGInstances {
						if in.Claim != nil {
							claimed++
						}
					}
				}
			}
			if claimed == running {
				break
			}
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the GPUNode %s does not list the running workloads' instances: %w", dynamicNode, wctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	for _, args := range [][]string{
		{"get", "gpunode", dynamicNode, "-o", "wide"},
		{"get", "gpunode", dynamicNode, "-o", `jsonpath={range .status.gpus[0].applied.migInstances[*]}{.profile}{"\tslices "}{.placement.start}{"+"}{.placement.size}{"\t"}{.claim.name}{"\t"}{.claim.pods[0]}{"\n"}{end}`},
	} {
		res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: c.kubectl, Args: append([]string{"--kubeconfig", c.kubeconfig}, args...)})
		shown := strings.Join(args[:3], " ")
		if args[3] == "-o" && args[4] != "wide" {
			shown += " -o jsonpath=<instances>"
		} else {
			shown += " -o wide"
		}
		if _, werr := fmt.Fprint(w, "\n$ kubectl ", shown, "\n", res.Stdout, res.Stderr, "\n"); werr != nil {
			return werr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
