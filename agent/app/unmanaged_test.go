package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/agent/guard"
	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/shimclient"
	"github.com/gpusharing/gpusharing/test/wait"
)

// unmanagedSeries is gpusharing_unmanaged_processes for the pod, and whether the series exists.
func unmanagedSeries(t *testing.T, gpu, pod string) (float64, bool) {
	t.Helper()
	return prom.Find(t, metrics.Registry, "gpusharing_unmanaged_processes", map[string]string{"gpu": gpu, "pod": pod})
}

// hostProcess makes pid look to the agent like a process of no pod (nvidia-smi, DCGM) through its cgroup.
func hostProcess(t *testing.T, procRoot string, pid int) {
	t.Helper()
	dir := filepath.Join(procRoot, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/system.slice/dcgm.service\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The whole agent over a mock GPU with oversubscription: a process of a pod that holds memory on the GPU
// and never connects to its scheduler (it dropped LD_PRELOAD) is named in the GPU's status (pod,
// container, pid, memory) against the connected client, by a False Managed condition, a warning event on
// its pod and gpusharing_unmanaged_processes, within the grace plus two reads; with unmanagedProcesses
// Evict its pod is evicted, with Report it is not. The client's pod and the host's process are never
// named, evented nor evicted. Once the process is gone, Managed is True again and the series goes.
func TestAPodThatDropsTheShimIsNamedAndEvictedWhereThePolicySays(t *testing.T) {
	const (
		grace    = time.Second
		interval = 100 * time.Millisecond
		dropPID  = 4343
		hostPID  = 4344
	)
	for _, action := range []v1alpha1.UnmanagedAction{v1alpha1.UnmanagedReport, v1alpha1.UnmanagedEvict} {
		t.Run(string(action), func(t *testing.T) {
			ctx := context.Background()
			procRoot := t.TempDir()
			n := startNodeWith(t, 1, func(o *Options) {
				o.ProcRoot = procRoot
				o.Accounting = &AccountingOptions{Interval: interval, UnmanagedGrace: grace}
			})
			uuid := n.uuid(0)
			sharing := oversubscribedTimeSlicing(2, 3*time.Second, "8Gi")
			sharing.UnmanagedProcesses = action
			n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: sharing})
			n.waitFor(t, "GPU 0 time-sliced with oversubscription", appliedAsDesired(uuid))

			// The dropper's pod exists before the holder connects, so the pod list the holder's admission
			// reads names it (a pod the agent has not listed is named at its next list: docs/accounting.md).
			dropper := accountedPod(t, "dropper-"+n.name, n.name, procRoot, dropPID)
			hostProcess(t, procRoot, hostPID)
			// The holder's process (this test process) is a client of the GPU's scheduler.
			holder := guardPod(t, "holder-"+n.name, n.name)
			n.pods.SetPods(fakekubelet.Pod("default", holder.Name, "gpusharing.io/gpu-shared", share.ReplicaID(uuid, 0)))
			runAs(t, procRoot, holder)
			shimclient.Dial(t, hostpath.SchedulerSocket(filepath.Join(n.dir, "s"), uuid), uuid)

			n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(uint32(os.Getpid()), 3<<30, 10), nvmlmock.Proc(dropPID, 2<<30, 10), nvmlmock.Proc(hostPID, 256<<20, 0))
			started := time.Now()
			n.waitFor(t, "the dropper named in status", func(g *v1alpha1.GPUNode) (bool, string) {
				gs := gpuState(g, uuid)
				u := gs.Unmanaged
				c := meta.FindStatusCondition(gs.Conditions, v1alpha1.ConditionManaged)
				if u == nil || c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonUnmanagedProcesses ||
					!strings.Contains(c.Message, "default/"+dropper.Name+" container main pid 4343") {
					return false, fmt.Sprintf("unmanaged %+v, Managed %+v", u, c)
				}
				ok := u.Clients == 1 && u.HostProcesses == 1 && len(u.Processes) == 1 && u.OmittedProcesses == 0
				if ok {
					p := u.Processes[0]
					ok = p.Namespace == "default" && p.Pod == dropper.Name && p.Container == "main" && p.PID == dropPID &&
						p.Memory != nil && p.Memory.Value() == 2<<30 && gs.Applied.UnmanagedProcesses == action
				}
				return ok, fmt.Sprintf("unmanaged %+v, applied.unmanagedProcesses %q", u, gs.Applied.UnmanagedProcesses)
			})
			took := time.Since(started)
			// The bound with these settings: the grace, a read to list the process and one to pass the
			// grace, and the pass (the slack covers a loaded machine).
			if bound := grace + 2*interval + 2*time.Second; took > bound {
				t.Errorf("named after %v, past the bound %v", took, bound)
			}
			t.Logf("%s: named %v after the process took its memory", action, took.Round(10*time.Millisecond))
			wait.UntilState(t, 30*time.Second, func() (bool, string) {
				got := eventsAbout(t, "Pod", dropper.Name, v1alpha1.ReasonUnmanagedProcesses)
				return len(got) == 1 && strings.HasPrefix(got[0], "Warning: ") && strings.Contains(got[0], "pid 4343 (2Gi)"),
					fmt.Sprintf("events on the pod: %q", got)
			}, "a warning event on the dropper's pod")
			if v, ok := unmanagedSeries(t, uuid, dropper.Name); !ok || v != 1 {
				t.Errorf("gpusharing_unmanaged_processes for the dropper = %v (present %v), want 1", v, ok)
			}
			if _, ok := unmanagedSeries(t, uuid, holder.Name); ok {
				t.Error("a series for the holder, a client")
			}
			if got := eventsAbout(t, "Pod", holder.Name, v1alpha1.ReasonUnmanagedProcesses); len(got) != 0 {
				t.Errorf("events on the holder, a client: %q", got)
			}

			// The pass that published the status had already evicted (or not): the status is written last.
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(dropper), dropper)
			evicted := apierrors.IsNotFound(err) || err == nil && dropper.DeletionTimestamp != nil
			if evicted != (action == v1alpha1.UnmanagedEvict) {
				t.Fatalf("unmanagedProcesses %s: dropper evicted = %v (get: %v)", action, evicted, err)
			}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(holder), holder); err != nil || holder.DeletionTimestamp != nil {
				t.Fatalf("the holder, a client, was evicted or is gone: %v", err)
			}

			n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(uint32(os.Getpid()), 3<<30, 10), nvmlmock.Proc(hostPID, 256<<20, 0))
			n.waitFor(t, "Managed again once the dropper's process is gone", func(g *v1alpha1.GPUNode) (bool, string) {
				gs := gpuState(g, uuid)
				c := meta.FindStatusCondition(gs.Conditions, v1alpha1.ConditionManaged)
				return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAllManaged && gs.Unmanaged != nil &&
					len(gs.Unmanaged.Processes) == 0 && gs.Unmanaged.Clients == 1, fmt.Sprintf("Managed %+v, unmanaged %+v", c, gs.Unmanaged)
			})
			if _, ok := unmanagedSeries(t, uuid, dropper.Name); ok {
				t.Error("the dropper's series outlived its process")
			}
		})
	}
}

// On an MPS GPU sized per claim a managed process is a client of the GPU's MPS server: the claim's pod
// whose process NVML lists as an MPS client is counted and never named; the same process outside the MPS
// server (its CUDA_MPS_PIPE_DIRECTORY changed) is named after the default grace, with an event on its pod,
// and reported only (unmanagedProcesses omitted is Report).
func TestOnASizedMPSGPUAProcessOutsideTheMPSServerIsNamed(t *testing.T) {
	pc := prepareSizedClaim(t, v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim})
	mpsClient := nvmlmock.Proc(pc.pid, 3<<30, 40)
	mpsClient.MPS = true
	pc.n.gpus.GPUs[0].SetUsage(mpsClient)
	managed := func(status metav1.ConditionStatus, reason string, clients int32, named int) func(*v1alpha1.GPUNode) (bool, string) {
		return func(g *v1alpha1.GPUNode) (bool, string) {
			gs := gpuState(g, pc.gpu)
			c := meta.FindStatusCondition(gs.Conditions, v1alpha1.ConditionManaged)
			u := gs.Unmanaged
			return c != nil && c.Status == status && c.Reason == reason && u != nil && u.Clients == clients && len(u.Processes) == named &&
				gs.Applied.UnmanagedProcesses == v1alpha1.UnmanagedReport, fmt.Sprintf("Managed %+v, unmanaged %+v", c, u)
		}
	}
	pc.n.waitFor(t, "the claim's MPS client counted, nothing named", managed(metav1.ConditionTrue, v1alpha1.ReasonAllManaged, 1, 0))

	pc.n.gpus.GPUs[0].SetUsage(nvmlmock.Proc(pc.pid, 3<<30, 40))
	started := time.Now()
	pc.n.waitFor(t, "the process outside the MPS server named", managed(metav1.ConditionFalse, v1alpha1.ReasonUnmanagedProcesses, 0, 1))
	if took := time.Since(started); took < guard.DefaultUnmanagedGrace-time.Second {
		t.Errorf("named %v after it left the MPS server, within the %v grace", took, guard.DefaultUnmanagedGrace)
	}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got := eventsAbout(t, "Pod", pc.pod.Name, v1alpha1.ReasonUnmanagedProcesses)
		return len(got) == 1 && strings.Contains(got[0], fmt.Sprintf("pid %d", pc.pid)), fmt.Sprintf("events on the pod: %q", got)
	}, "a warning event on the claim's pod")
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pc.pod), pc.pod); err != nil || pc.pod.DeletionTimestamp != nil {
		t.Fatalf("the pod was evicted under Report: %v", err)
	}
}
