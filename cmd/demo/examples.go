package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// examplesDir holds the pod manifests users apply (examples/pods/README.md); the demo applies the files
// themselves, so what it shows is what they get.
const examplesDir = "examples/pods"

// runtimeClassFile is the RuntimeClass nvidia users install where nothing else created it.
const runtimeClassFile = "config/runtimeclass/runtimeclass.yaml"

// exampleLabel is the label every pod of examplesDir carries.
const exampleLabel = "app.kubernetes.io/name=gpusharing-example"

// runExamples applies examples/pods with the real kubectl, waits until the kube-scheduler has placed
// every pod and the stand-in kubelets have prepared their claims, and prints where each landed and
// what it got: its devices and the variables the agent's CDI spec gives its containers.
func (c *cluster) runExamples(ctx context.Context, w io.Writer) error {
	// The pods land wherever the scheduler finds their devices: every node with the DRA plugin is Ready.
	for _, n := range simNodes {
		if n.DRAPlugin {
			if _, err := c.env.ReadyNode(ctx, n.Name); err != nil {
				return err
			}
		}
	}
	say("Deleting pod train-3g: mig-dynamic.yaml's 2g.20gb needs a free placement, and slices 0-3 come back")
	if err := c.env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train-3g"}}); client.IgnoreNotFound(err) != nil {
		return err
	}
	dir := filepath.Join(c.env.RepoRoot, examplesDir)
	// The API server refuses a pod whose RuntimeClass or PriorityClass does not exist: the RuntimeClass
	// nvidia the pods name (config/runtimeclass, what a GPU node's NVIDIA container toolkit needs) and the
	// PriorityClasses go first.
	for _, path := range []string{filepath.Join(c.env.RepoRoot, runtimeClassFile), filepath.Join(dir, "priorityclasses.yaml"), dir} {
		if err := c.runKubectl(ctx, w, "apply", "-f", path); err != nil {
			return err
		}
	}
	if err := c.waitExamples(ctx); err != nil {
		return err
	}
	if err := c.runKubectl(ctx, w, "get", "pods", "-l", exampleLabel, "-o", "wide"); err != nil {
		return err
	}
	if err := c.printExamples(ctx, w); err != nil {
		return err
	}
	// The agents' side: each GPUNode names the pods whose claims its plugin prepared, per GPU. (Its
	// production column stays "-": the class is read from the processes on the GPU, and none runs here.)
	nodes, err := c.waitClaimedBy(ctx)
	if err != nil {
		return err
	}
	return c.runKubectl(ctx, w, append(append([]string{"get", "gpunode"}, nodes...), "-o", "custom-columns=NODE:.metadata.name,CLAIMED BY:.status.claimedBy")...)
}

// waitClaimedBy waits (bounded) until every example pod is named in its node's status.claimedBy, which
// the agent writes on its pass after the plugin prepared the pod's claims, and returns the nodes.
func (c *cluster) waitClaimedBy(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sel, err := labelSelector()
	if err != nil {
		return nil, err
	}
	for {
		var pods corev1.PodList
		var missing, nodes []string
		if err := c.env.Client.List(ctx, &pods, client.InNamespace("default"), sel); err == nil {
			seen := map[string]bool{}
			for _, p := range pods.Items {
				var gn v1alpha1.GPUNode
				if err := c.env.Client.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, &gn); err != nil || !strings.Contains(gn.Status.ClaimedBy, p.Namespace+"/"+p.Name) {
					missing = append(missing, p.Name)
				}
				if !seen[p.Spec.NodeName] {
					seen[p.Spec.NodeName] = true
					nodes = append(nodes, p.Spec.NodeName)
				}
			}
			if len(missing) == 0 {
				sort.Strings(nodes)
				return nodes, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the GPUNodes do not name pods %s among their claims' pods within 30s", strings.Join(missing, ", "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// runKubectl runs the real kubectl and prints the command and its output, paths relative to the repository.
func (c *cluster) runKubectl(ctx context.Context, w io.Writer, args ...string) error {
	res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: c.kubectl, Args: append([]string{"--kubeconfig", c.kubeconfig}, args...)})
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if strings.Contains(a, " ") {
			quoted[i] = "'" + a + "'"
		}
	}
	shown := strings.ReplaceAll(strings.Join(quoted, " "), c.env.RepoRoot+"/", "")
	if _, werr := fmt.Fprint(w, "\n$ kubectl ", shown, "\n", res.Stdout, res.Stderr); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("kubectl %s: %w", shown, err)
	}
	return nil
}

// waitExamples waits (bounded) until every example pod is Running; otherwise it names each that is
// not, with the scheduler's or the kubelet's reason.
func (c *cluster) waitExamples(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sel, err := labelSelector()
	if err != nil {
		return err
	}
	for {
		var pods corev1.PodList
		var waiting []string
		if err := c.env.Client.List(ctx, &pods, client.InNamespace("default"), sel); err == nil {
			for _, p := range pods.Items {
				if p.Status.Phase != corev1.PodRunning {
					waiting = append(waiting, p.Name+": "+whyNotRunning(&p))
				}
			}
			if len(pods.Items) > 0 && len(waiting) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pods of %s not Running within a minute:\n  %s", examplesDir, strings.Join(waiting, "\n  "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func labelSelector() (client.MatchingLabelsSelector, error) {
	s, err := metav1.ParseToLabelSelector(exampleLabel)
	if err != nil {
		return client.MatchingLabelsSelector{}, err
	}
	ls, err := metav1.LabelSelectorAsSelector(s)
	return client.MatchingLabelsSelector{Selector: ls}, err
}

// whyNotRunning is the pod's scheduling condition or the stand-in kubelet's message.
func whyNotRunning(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue {
			return "not scheduled: " + cond.Message
		}
	}
	if p.Spec.NodeName == "" {
		return "not scheduled yet"
	}
	if p.Status.Message != "" {
		return "on " + p.Spec.NodeName + ": " + p.Status.Message
	}
	return "on " + p.Spec.NodeName + ", claims not prepared yet"
}

// printExamples prints, per example pod, its node, the devices its claims were allocated (with the
// memory a sized claim consumes) and the variables the agent's CDI spec sets for them.
func (c *cluster) printExamples(ctx context.Context, w io.Writer) error {
	sel, err := labelSelector()
	if err != nil {
		return err
	}
	var pods corev1.PodList
	if err := c.env.Client.List(ctx, &pods, client.InNamespace("default"), sel); err != nil {
		return err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	if _, err := fmt.Fprintf(w, "\nWhat each pod got (its claims' devices; the variables of the CDI spec the agent wrote for them):\n"); err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		var devices, env []string
		for _, name := range claimNames(p) {
			var claim resourcev1.ResourceClaim
			if err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: name}, &claim); err != nil {
				return fmt.Errorf("pod %s: claim %s: %w", p.Name, name, err)
			}
			devices = append(devices, allocated(&claim)...)
			e, err := cdiEnv(filepath.Join(c.dir, p.Spec.NodeName, "cdi"), claim.UID)
			if err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
			env = append(env, e...)
		}
		if _, err := fmt.Fprintf(w, "  %-14s %-11s %s\n", p.Name, p.Spec.NodeName, strings.Join(devices, ", ")); err != nil {
			return err
		}
		for _, e := range env {
			if _, err := fmt.Fprintf(w, "  %-14s %-11s   %s\n", "", "", e); err != nil {
				return err
			}
		}
	}
	return nil
}

// claimNames are the claims of the pod: its own and the one the scheduler made for its extended
// resources.
func claimNames(p *corev1.Pod) []string {
	var out []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out = append(out, *s.ResourceClaimName)
		}
	}
	for _, pc := range p.Spec.ResourceClaims {
		if pc.ResourceClaimName != nil {
			out = append(out, *pc.ResourceClaimName)
		}
	}
	if s := p.Status.ExtendedResourceClaimStatus; s != nil {
		out = append(out, s.ResourceClaimName)
	}
	return out
}

// allocated names the claim's devices, with the memory each consumes where the claim sized it.
func allocated(claim *resourcev1.ResourceClaim) []string {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		d := r.Device
		if m, ok := r.ConsumedCapacity[dra.CapacityMemory]; ok {
			d += " (" + m.String() + ")"
		}
		out = append(out, d)
	}
	return out
}

// cdiEnv reads the variables of the claim's CDI spec, as the container runtime would inject them.
func cdiEnv(dir string, uid types.UID) ([]string, error) {
	data, err := os.ReadFile(dra.CDISpecPath(dir, uid))
	if err != nil {
		return nil, fmt.Errorf("the CDI spec of claim %s: %w", uid, err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("the CDI spec of claim %s: %w", uid, err)
	}
	var out []string
	for _, d := range spec.Devices {
		out = append(out, d.ContainerEdits.Env...)
	}
	out = append(out, spec.ContainerEdits.Env...)
	return out, nil
}
