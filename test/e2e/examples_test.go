//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// ExampleImage is the image examples/pods name. The e2e node gives the local busybox this name (main_test),
// as pushing it to a registry under that name would: the pods' script needs a shell, env, grep and sort.
const ExampleImage = "docker.io/library/ubuntu:24.04"

// example is one step of the ExamplePods scenario: a pool label on the node, the policy samples for it
// (config/samples), and the files of examples/pods applied as the README's install ends, each pod then
// checked against what it printed.
type example struct {
	pool     string
	samples  []string // config/samples/gpusharing_v1alpha1_policy_<sample>.yaml
	policies []string // the samples' policy names
	files    []string // examples/pods/<file>.yaml, in order
	pods     []string
	check    func(t *testing.T, pods map[string]map[string]string, gpus map[int32]string)
}

// testExamplePods runs examples/pods on the default install, which serves every share through DRA with
// no device plugin on the node: the kubelet advertises no extended resource, yet the pods that ask for
// gpusharing.io/gpu-timeslice, gpusharing.io/gpu-shared or nvidia.com/gpu in their limits are scheduled by
// the kube-scheduler through the DeviceClasses' extended resource names, prepared by the agent's DRA
// plugin and run with their share's environment; the claim pods (sized, dynamic MIG) run the same way.
// Each step is the README's: label the node, apply the sample, apply the pod, `kubectl get gpusharing`.
func testExamplePods(t *testing.T) {
	dumpOnFailure(t)
	ensureNamespace(t)
	gpus, _ := gpuUUIDs(t)
	eventually(t, time.Minute, "a node without the device plugin", func(ctx context.Context) error {
		var n corev1.Node
		if err := k8s.Get(ctx, client.ObjectKey{Name: NodeName}, &n); err != nil {
			return err
		}
		for name, q := range n.Status.Allocatable {
			if (strings.HasPrefix(string(name), "gpusharing.io/") || strings.HasPrefix(string(name), "nvidia.com/")) && !q.IsZero() {
				return fmt.Errorf("the kubelet advertises %s=%s: a device plugin serves it", name, q.String())
			}
		}
		return nil
	})
	for _, ex := range []example{
		{pool: "notebooks", samples: []string{"timeslicing", "sized"}, policies: []string{"notebooks-timeslicing", "notebooks-sized"},
			files: []string{"timeslice", "sized"}, pods: []string{"timeslice", "sized"}, check: checkNotebooks},
		{pool: "serving", samples: []string{"qos"}, policies: []string{"serving-qos"},
			files: []string{"priorityclasses", "production", "opportunistic"}, pods: []string{"production", "opportunistic"}, check: checkServing},
		{pool: "dynamic", samples: []string{"dynamic_mig"}, policies: []string{"dynamic-mig"},
			files: []string{"mig-dynamic"}, pods: []string{"mig-dynamic"}, check: checkMIGDynamic},
		{pool: "training", samples: []string{"exclusive"}, policies: []string{"training-exclusive"},
			files: []string{"two-gpus"}, pods: []string{"two-gpus"}, check: checkTwoWholeGPUs},
	} {
		t.Run(ex.pool, func(t *testing.T) { runExample(t, ex, gpus) })
	}
	kubectl(t, "label", "node", NodeName, "pool-")
	kubectl(t, "delete", "-f", "examples/pods/priorityclasses.yaml")
}

func runExample(t *testing.T, ex example, gpus map[int32]string) {
	kubectl(t, "label", "node", NodeName, "pool="+ex.pool, "--overwrite")
	for _, s := range ex.samples {
		kubectl(t, "apply", "-f", "config/samples/gpusharing_v1alpha1_policy_"+s+".yaml")
	}
	for _, p := range ex.policies {
		kubectl(t, "wait", "--for=condition=Ready", "gpusharingpolicy/"+p, "--timeout=180s")
	}
	var files []string
	for _, f := range ex.files {
		files = append(files, "-f", "examples/pods/"+f+".yaml")
	}
	kubectl(t, append([]string{"-n", Namespace, "apply"}, files...)...)
	envs := map[string]map[string]string{}
	for _, pod := range ex.pods {
		kubectl(t, "-n", Namespace, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=180s")
		envs[pod] = exampleEnv(t, pod)
	}
	ex.check(t, envs, gpus)
	// `kubectl get gpusharing -o wide` names each pod beside the GPU its claim holds (Claimed By).
	eventually(t, time.Minute, "kubectl get gpusharing -o wide naming the pods", func(context.Context) error {
		out, err := kubectlErr("get", "gpusharing", "-o", "wide")
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		for _, pod := range ex.pods {
			if !strings.Contains(out, Namespace+"/"+pod) {
				return fmt.Errorf("no %s/%s in:\n%s", Namespace, pod, out)
			}
		}
		t.Logf("kubectl get gpusharing -o wide:\n%s", out)
		return nil
	})
	var pods []string
	for _, f := range ex.files {
		if f != "priorityclasses" {
			pods = append(pods, "-f", "examples/pods/"+f+".yaml")
		}
	}
	kubectl(t, append([]string{"-n", Namespace, "delete", "--wait=true", "--timeout=120s"}, pods...)...)
	for _, s := range ex.samples {
		kubectl(t, "delete", "-f", "config/samples/gpusharing_v1alpha1_policy_"+s+".yaml", "--wait=true", "--timeout=180s")
	}
	eventually(t, 2*time.Minute, "every GPU Exclusive again", func(ctx context.Context) error {
		for i := int32(0); i < 8; i++ {
			if err := gpuApplied(ctx, i, v1alpha1.StrategyExclusive); err != nil {
				return err
			}
		}
		return nil
	})
}

// exampleEnv is the environment an example pod printed (its first lines, KEY=VALUE).
func exampleEnv(t *testing.T, pod string) map[string]string {
	t.Helper()
	env := map[string]string{}
	eventually(t, time.Minute, "pod "+pod+"'s environment", func(context.Context) error {
		out, err := kubectlErr("-n", Namespace, "logs", pod)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				env[k] = v
			}
		}
		if env["NVIDIA_VISIBLE_DEVICES"] == "" {
			return fmt.Errorf("no NVIDIA_VISIBLE_DEVICES in %q", out)
		}
		return nil
	})
	return env
}

// extendedClaim is the claim the kube-scheduler made for a pod's extended resource, and the devices the
// pod's status maps it to.
func extendedClaim(t *testing.T, pod, container, resourceName string) []string {
	t.Helper()
	ctx := context.Background()
	var p corev1.Pod
	must(t, k8s.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: pod}, &p))
	st := p.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatalf("pod %s asked for %s and has no extendedResourceClaimStatus: not served through DRA", pod, resourceName)
	}
	var request string
	for _, m := range st.RequestMappings {
		if m.ContainerName == container && m.ResourceName == resourceName {
			request = m.RequestName
		}
	}
	if request == "" {
		t.Fatalf("pod %s's extendedResourceClaimStatus maps no request to %s/%s: %+v", pod, container, resourceName, st)
	}
	var c resourcev1.ResourceClaim
	must(t, k8s.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: st.ResourceClaimName}, &c))
	if c.Status.Allocation == nil {
		t.Fatalf("claim %s is not allocated", c.Name)
	}
	var devices []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Request == request && r.Driver == "gpu.gpusharing.io" && r.Pool == NodeName {
			devices = append(devices, r.Device)
		}
	}
	slices.Sort(devices)
	return devices
}

// gpuOfDevice is the index a published device name starts with (gpu-<index>...).
func gpuOfDevice(t *testing.T, device string) int32 {
	t.Helper()
	var i int32
	if _, err := fmt.Sscanf(device, "gpu-%d", &i); err != nil {
		t.Fatalf("device %q: %v", device, err)
	}
	return i
}

// checkNotebooks: the time-slice pod, which asked gpusharing.io/gpu-timeslice: 1 and nothing else, holds
// one time-slice replica of GPU 0-3 (the sized sample takes 4-7) through the claim the scheduler made,
// and sees that GPU; the sized pod sees an MPS GPU of 4-7 with its claim's 30 % of the SMs.
func checkNotebooks(t *testing.T, envs map[string]map[string]string, gpus map[int32]string) {
	devs := extendedClaim(t, "timeslice", "notebook", "gpusharing.io/gpu-timeslice")
	if len(devs) != 1 || !strings.Contains(devs[0], "-timeslicing-") {
		t.Fatalf("the time-slice pod's claim holds %v, want one time-slice replica", devs)
	}
	if i := gpuOfDevice(t, devs[0]); i > 3 || envs["timeslice"]["NVIDIA_VISIBLE_DEVICES"] != gpus[i] {
		t.Errorf("the time-slice pod holds %s and sees %q, want GPU %d (0-3) %s", devs[0], envs["timeslice"]["NVIDIA_VISIBLE_DEVICES"], i, gpus[i])
	}
	if v := envs["timeslice"]["LD_PRELOAD"]; v != "" {
		t.Errorf("a plain time-slice share got LD_PRELOAD=%s", v)
	}
	sized := envs["sized"]
	if !slices.Contains([]string{gpus[4], gpus[5], gpus[6], gpus[7]}, sized["NVIDIA_VISIBLE_DEVICES"]) {
		t.Errorf("the sized pod sees %q, want a GPU of 4-7", sized["NVIDIA_VISIBLE_DEVICES"])
	}
	if sized["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "30" || sized["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "" {
		t.Errorf("the sized pod's MPS limits: threads %q, memory %q; want 30 and its claim's memory",
			sized["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], sized["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
}

// checkServing: both pods asked gpusharing.io/gpu-shared: 1 and hold a shim share through DRA: the
// shim's library and their GPU's scheduler socket.
func checkServing(t *testing.T, envs map[string]map[string]string, gpus map[int32]string) {
	for _, pod := range []string{"production", "opportunistic"} {
		container := map[string]string{"production": "inference", "opportunistic": "training"}[pod]
		devs := extendedClaim(t, pod, container, "gpusharing.io/gpu-shared")
		if len(devs) != 1 || !strings.Contains(devs[0], "-shared-") {
			t.Fatalf("%s's claim holds %v, want one shim share", pod, devs)
		}
		e := envs[pod]
		if e["NVIDIA_VISIBLE_DEVICES"] != gpus[gpuOfDevice(t, devs[0])] || e["LD_PRELOAD"] == "" || e["GPUSHARE_SOCKET"] == "" {
			t.Errorf("%s holds %s and got %v, want its GPU, the shim's LD_PRELOAD and GPUSHARE_SOCKET", pod, devs[0], e)
		}
	}
}

// checkMIGDynamic: the claim's 2g.20gb instance, created for it, is what the pod sees.
func checkMIGDynamic(t *testing.T, envs map[string]map[string]string, _ map[int32]string) {
	if v := envs["mig-dynamic"]["NVIDIA_VISIBLE_DEVICES"]; !strings.HasPrefix(v, "MIG-") {
		t.Errorf("the MIG pod sees %q, want its MIG instance", v)
	}
}

// checkTwoWholeGPUs: nvidia.com/gpu: 2 through DRA is two whole GPUs, both visible.
func checkTwoWholeGPUs(t *testing.T, envs map[string]map[string]string, gpus map[int32]string) {
	devs := extendedClaim(t, "two-gpus", "training", "nvidia.com/gpu")
	if len(devs) != 2 {
		t.Fatalf("the two-GPU pod's claim holds %v, want two whole GPUs", devs)
	}
	var want []string
	for _, d := range devs {
		want = append(want, gpus[gpuOfDevice(t, d)])
	}
	got := strings.Split(envs["two-gpus"]["NVIDIA_VISIBLE_DEVICES"], ",")
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the two-GPU pod sees %v, want %v (its claim's %v)", got, want, devs)
	}
}

// testDevicePluginInstall switches the node to the device plugin path (config/e2e/deviceplugin: the
// install of clusters before Kubernetes 1.36): the agent serves the kubelet device plugin beside DRA and
// the DeviceClasses name no extended resource, so the extended resources are the device plugin's again,
// which the later scenarios use.
func testDevicePluginInstall(t *testing.T) {
	dumpOnFailure(t)
	kubectl(t, "apply", "--server-side", "-k", "config/e2e/deviceplugin")
	kubectl(t, "-n", "gpusharing-system", "rollout", "status", "daemonset/gpusharing-agent", "--timeout=180s")
	eventually(t, 2*time.Minute, "the device plugin advertising the 8 GPUs", func(ctx context.Context) error {
		return allocatableIs(ctx, map[corev1.ResourceName]int64{"nvidia.com/gpu": 8})
	})
	var dc resourcev1.DeviceClass
	must(t, k8s.Get(context.Background(), client.ObjectKey{Name: "gpusharing-timeslicing"}, &dc))
	if dc.Spec.ExtendedResourceName != nil {
		t.Errorf("DeviceClass gpusharing-timeslicing still names %s", *dc.Spec.ExtendedResourceName)
	}
}
