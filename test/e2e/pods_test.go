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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

const (
	// Namespace holds the e2e's workloads.
	Namespace = "e2e"
	// BusyboxImage is the test pods' image (make images).
	BusyboxImage = "gpusharing.io/e2e/busybox:1"
)

// reportScript is what every share pod runs: it prints its environment and mount table and probes what
// Allocate promised (the shim's socket, a read-only library), then stays up.
const reportScript = `echo "== env"; env | sort
echo "== mounts"; awk '{print $5, $6}' /proc/self/mountinfo
echo "== probes"
[ -n "$GPUSHARE_SOCKET" ] && [ -S "$GPUSHARE_SOCKET" ] && echo "probe socket=ok"
[ -n "$LD_PRELOAD" ] && { if touch "$LD_PRELOAD" 2>/dev/null; then echo "probe library=writable"; else echo "probe library=readonly"; fi; }
awk '$5 == "/dev/shm" { for (i = 7; i < NF; i++) if ($i == "-") print "probe shm=" $(i+1) " " $(i+2) " " $(i+3) }' /proc/self/mountinfo
echo "== end"
exec sleep 3600`

// sharePod is a pod asking for count of resource, running reportScript.
func sharePod(name string, resource corev1.ResourceName, count int64, labels map[string]string) *corev1.Pod {
	limits := corev1.ResourceList{}
	if resource != "" {
		limits[resource] = *resourceQuantity(count)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name: "report", Image: BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"/bin/sh", "-c", reportScript},
				Resources: corev1.ResourceRequirements{Limits: limits},
			}},
		},
	}
}

func resourceQuantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }
func ptr[T any](v T) *T                           { return &v }

// report is what a share pod printed about itself.
type report struct {
	env    map[string]string
	mounts map[string]string // mount point -> options
	probes map[string]string
}

// readReport waits for the pod's own output to be complete and parses it.
func readReport(t *testing.T, pod string) report {
	t.Helper()
	var out string
	eventually(t, 90*time.Second, "pod "+pod+"'s report", func(ctx context.Context) error {
		o, err := kubectlErr("-n", Namespace, "logs", pod)
		if err != nil || !strings.Contains(o, "== end") {
			return fmt.Errorf("%v: %s", err, o)
		}
		out = o
		return nil
	})
	r := report{env: map[string]string{}, mounts: map[string]string{}, probes: map[string]string{}}
	section := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "== ") {
			section = strings.TrimPrefix(line, "== ")
			continue
		}
		switch section {
		case "env":
			if k, v, ok := strings.Cut(line, "="); ok {
				r.env[k] = v
			}
		case "mounts":
			if mp, opts, ok := strings.Cut(line, " "); ok {
				r.mounts[mp] = opts
			}
		case "probes":
			if k, v, ok := strings.Cut(strings.TrimPrefix(line, "probe "), "="); ok {
				r.probes[k] = v
			}
		}
	}
	return r
}

// gpuUUIDs returns the node's GPU uuids by index and its MIG device uuids by profile, from GPUNode status.
func gpuUUIDs(t *testing.T) (byIndex map[int32]string, migByProfile map[string][]string) {
	t.Helper()
	var gn v1alpha1.GPUNode
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: NodeName}, &gn); err != nil {
		t.Fatal(err)
	}
	byIndex, migByProfile = map[int32]string{}, map[string][]string{}
	for _, g := range gn.Status.GPUs {
		byIndex[g.Index] = g.UUID
		if g.Applied != nil {
			for _, d := range g.Applied.MIGInstances {
				migByProfile[d.Profile] = append(migByProfile[d.Profile], d.UUID)
			}
		}
	}
	return byIndex, migByProfile
}

// testPods schedules real pods on every kind of share and checks, from each container's own output, the
// env and mounts docs/deviceplugin.md promises; a pod with two time-slice replicas gets two GPUs; a pod
// asking for more than exists stays Pending with the scheduler's reason.
func testPods(t *testing.T) {
	dumpOnFailure(t)
	ctx := context.Background()
	ensureNamespace(t)
	gpus, mig := gpuUUIDs(t)
	pods := []*corev1.Pod{
		sharePod("mig-3g", "nvidia.com/mig-3g.40gb", 1, nil),
		sharePod("mig-1g", "nvidia.com/mig-1g.10gb", 1, nil),
		sharePod("mps", "gpusharing.io/gpu-mps", 1, nil),
		sharePod("timeslice-2", "gpusharing.io/gpu-timeslice", 2, nil),
		sharePod("shim", "gpusharing.io/gpu-shared", 1, nil),
		sharePod("too-many", "gpusharing.io/gpu-mps", 9, nil),
	}
	for _, p := range pods {
		if err := k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	visible := func(r report) []string {
		if r.env["NVIDIA_VISIBLE_DEVICES"] != r.env["CUDA_VISIBLE_DEVICES"] {
			t.Errorf("NVIDIA_VISIBLE_DEVICES %q != CUDA_VISIBLE_DEVICES %q", r.env["NVIDIA_VISIBLE_DEVICES"], r.env["CUDA_VISIBLE_DEVICES"])
		}
		return strings.Split(r.env["NVIDIA_VISIBLE_DEVICES"], ",")
	}
	in := func(what string, got []string, allowed ...string) {
		for _, g := range got {
			if !slices.Contains(allowed, g) {
				t.Errorf("%s: device %s is not one of %v", what, g, allowed)
			}
		}
	}
	ro := func(what string, r report, mountPoint string, wantRO bool) {
		opts, ok := r.mounts[mountPoint]
		if !ok {
			t.Errorf("%s: %s is not mounted", what, mountPoint)
			return
		}
		if isRO := strings.HasPrefix(opts, "ro"); isRO != wantRO {
			t.Errorf("%s: %s mounted %s, want read-only=%v", what, mountPoint, opts, wantRO)
		}
	}

	r := readReport(t, "mig-3g")
	in("mig-3g", visible(r), mig["3g.40gb"]...)
	r = readReport(t, "mig-1g")
	in("mig-1g", visible(r), mig["1g.10gb"]...)

	r = readReport(t, "mps")
	in("mps", visible(r), gpus[2], gpus[3])
	for k, v := range map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/var/run/gpusharing/mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=18432M"} {
		if r.env[k] != v {
			t.Errorf("mps: %s=%q, want %q", k, r.env[k], v)
		}
	}
	ro("mps", r, "/var/run/gpusharing/mps", false)
	ro("mps", r, "/dev/shm", false)
	// The GPU's own tmpfs, which the agent mounted (source gpusharing-mps-shm) with --mps-shm-size=2Gi.
	if shm := r.probes["shm"]; !strings.HasPrefix(shm, "tmpfs gpusharing-mps-shm ") || !strings.Contains(shm, "size=2097152k") {
		t.Errorf("mps: /dev/shm is %q, want the GPU's tmpfs (gpusharing-mps-shm, size=2097152k)", shm)
	}

	r = readReport(t, "timeslice-2")
	ts := visible(r)
	in("timeslice-2", ts, gpus[4], gpus[5])
	if len(ts) != 2 || ts[0] == ts[1] {
		t.Errorf("timeslice-2: two replicas on %v, want one on each of two GPUs", ts)
	}

	r = readReport(t, "shim")
	shim := visible(r)
	in("shim", shim, gpus[6], gpus[7])
	for k, v := range map[string]string{"LD_PRELOAD": "/usr/lib/gpusharing/libgpushare.so", "GPUSHARE_SOCKET": "/var/run/gpusharing/scheduler/gpushare.sock", "GPUSHARE_GPU_UUID": shim[0], "GPUSHARE_OVERSUB": "1"} {
		if r.env[k] != v {
			t.Errorf("shim: %s=%q, want %q", k, r.env[k], v)
		}
	}
	ro("shim", r, "/usr/lib/gpusharing/libgpushare.so", true)
	ro("shim", r, "/var/run/gpusharing/scheduler", true)
	if r.probes["socket"] != "ok" || r.probes["library"] != "readonly" {
		t.Errorf("shim: probes %v, want the scheduler socket reachable and the library read-only", r.probes)
	}

	eventually(t, time.Minute, "too-many Pending with the scheduler's reason", func(ctx context.Context) error {
		var p corev1.Pod
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "too-many"}, &p); err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
				strings.Contains(c.Message, "Insufficient gpusharing.io/gpu-mps") {
				t.Logf("too-many: %s: %s", c.Reason, c.Message)
				return nil
			}
		}
		return fmt.Errorf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	kubectl(t, "-n", Namespace, "delete", "pods", "--all", "--wait=true", "--timeout=60s")
}
