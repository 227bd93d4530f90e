package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
)

// Right-sizing through the whole stack (docs/rightsizing.md): a PyTorch workload whose peak is known
// (test/gpu/rightsize/workload.py) runs as three pods of one ReplicaSet, each with a 10Gi claim made as
// the kube-controller-manager makes claims from a template; the agent reads their memory through NVML
// and publishes it, the manager (short --rightsizing-* intervals) recommends. Checked: the target lies
// within the stated margin above NVML's peak; a claim of the size recommended runs the same workload to
// its end without being reported, and shows the workload's use in its device status; a claim of half
// the peak is refused memory by the shim, and the refusal is counted in the claim's status.
const (
	rsPeakMiB      = 3072
	rsSeconds      = 12 // each run's matmul time: several of the agent's reads see its peak
	rsClaim        = "10Gi"
	rsReplicaSet   = "train-7f6d5c"
	rsRecName      = "replicaset-" + rsReplicaSet + "-" + sizedRequest
	rsRunTimeout   = 150 * time.Second
	rsStatusWindow = 60 * time.Second
	// The manager's short intervals for this run (cmd/manager's defaults: 15s, 1m, 10m, 10m).
	rsSampleInterval = time.Second
	rsWriteInterval  = 2 * time.Second
)

// managerRightsizingFlags are the manager's right-sizing flags here: samples every second, writes every
// two, and a recommendation from the third pod's peak on, with no wait for history.
var managerRightsizingFlags = []string{"--rightsizing-sample-interval=" + rsSampleInterval.String(),
	"--rightsizing-write-interval=" + rsWriteInterval.String(), "--rightsizing-checkpoint-interval=" + rsWriteInterval.String(),
	"--rightsizing-min-history=0s"}

var rsCase = sizedCase{title: "right-sizing", policy: "rightsizing.yaml", strategy: v1alpha1.StrategyExclusive,
	enforcement: dra.EnforcementShimMemory, prefix: "rs"}

// rsPod is one pod of the ReplicaSet with its template-made claim and its workload's run.
type rsPod struct {
	pod      *corev1.Pod
	claim    *resourcev1.ResourceClaim
	prepared bool
	c        *container
	// nvmlPeak is the most NVML showed its process hold (bytes), read every 100 ms.
	nvmlPeak int64
	exit     int
}

func (s *stack) rightsizing(ctx context.Context) {
	s.r.begin("right-sizing: three pods of a workload peaking at 3Gi on 10Gi claims, then a claim of the size recommended")
	start := time.Now()
	kubelet, err := dialDRA(s.draDir)
	if !s.r.must("dial the agent's DRA kubelet plugin", err) {
		return
	}
	defer kubelet.close()
	var pods []*rsPod
	defer func() { s.rsCleanup(ctx, kubelet, pods) }()

	free := gpuFreeMiB(ctx, s.o.gpuIndex)
	if !s.r.check("GPU: room for three runs", free >= 3*(rsPeakMiB+1024), "%d MiB free, need %d", free, 3*(rsPeakMiB+1024)) {
		return
	}
	dev, ok := s.applySized(ctx, rsCase)
	if !ok {
		return
	}
	rs, err := s.rsReplicaSet(ctx)
	if !s.r.must("create ReplicaSet "+rsReplicaSet, err) {
		return
	}
	for i := range 3 {
		p, err := s.rsStartPod(ctx, kubelet, dev, rs, fmt.Sprintf("%05d", i), resource.MustParse(rsClaim))
		if p != nil {
			pods = append(pods, p)
		}
		if !s.r.must("start pod "+strconv.Itoa(i)+" of the workload", err) {
			return
		}
	}
	published := s.rsRun(ctx, pods...)
	var top int64
	for _, p := range pods {
		s.r.check(p.pod.Name+": the workload ran to its end", p.exit == 0, "exit %d, NVML peak %d MiB", p.exit, p.nvmlPeak>>20)
		top = max(top, p.nvmlPeak)
	}
	rec, err := s.rsRecommendation(ctx, 3)
	if !s.r.must("GPUShareRecommendation "+rsRecName+" from the three pods", err) {
		return
	}
	target := rec.Status.Memory.Target.Value()
	fmt.Printf("right-sizing: NVML peak %d MiB, published peak %d MiB, target %d MiB, claim %s, %d samples, after %.1fs\n",
		top>>20, published>>20, target>>20, rec.Status.InitialMemory, rec.Status.Samples, time.Since(start).Seconds())
	// The stated margin: the end of the peak's 5 % bucket plus 10 %, of the peak as the agent published it
	// (a figure moves in status by 256 MiB or 5 %, so it may stand that much below NVML's highest).
	lo, hi := float64(published)*1.10, float64(published)*1.05*1.10+(1<<20)
	s.r.check("target within the margin above the published peak: [peak x 1.10, peak x 1.05 x 1.10]", float64(target) >= lo && float64(target) <= hi,
		"target %d MiB in [%.0f, %.0f] MiB", target>>20, lo/(1<<20), hi/(1<<20))
	step := max(int64(256<<20), top/20)
	// nvidia-smi lists whole MiB, the agent NVML's bytes rounded down to MiB.
	s.r.check("published peak within the status threshold of NVML's peak", published <= top+(1<<20) && top-published < step,
		"published %d MiB, NVML %d MiB, threshold %d MiB", published>>20, top>>20, step>>20)
	s.r.check("target above NVML's peak", target > top, "target %d MiB, NVML peak %d MiB", target>>20, top>>20)

	claimSize := *rec.Status.InitialMemory
	at, err := s.rsStartPod(ctx, kubelet, dev, rs, "atrec", claimSize)
	if at != nil {
		pods = append(pods, at)
	}
	if !s.r.must("start a pod with a claim of the size recommended ("+claimSize.String()+")", err) {
		return
	}
	reported := s.rsWatchReports(ctx, at)
	s.r.check("the workload runs to its end on the claim recommended", at.exit == 0 && at.nvmlPeak <= claimSize.Value(),
		"exit %d, NVML peak %d MiB, claim %s", at.exit, at.nvmlPeak>>20, claimSize.String())
	s.r.check("not reported: WithinClaims never False, no allocation refused", reported == "", "%s", reported)
	s.rsDeviceStatus(ctx, at)

	half := resource.NewQuantity((top/2)>>28<<28, resource.BinarySI)
	ctl, err := s.rsStartPod(ctx, kubelet, dev, rs, "half", *half)
	if ctl != nil {
		pods = append(pods, ctl)
	}
	if !s.r.must("start the control: a claim of half the peak ("+half.String()+")", err) {
		return
	}
	s.rsRun(ctx, ctl)
	s.r.check("control: refused memory under half the peak (exit 3)", ctl.exit == 3, "exit %d", ctl.exit)
	_, err = s.waitGPU(ctx, rsStatusWindow, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		c := sizedClaim(g, ctl.claim.Name)
		return c != nil && c.AllocationsRefused > 0 && c.RefusedDemand != nil && c.RefusedDemand.Cmp(*half) > 0
	})
	_, g := s.gpuNode(ctx)
	s.r.check("control: the refusal counted in the claim's status, with a demand past the claim", err == nil, "%s", jsonOf(sizedClaim(g, ctl.claim.Name)))
	s.rsPrintTable(ctx)
	fmt.Printf("time right-sizing: %.1fs\n", time.Since(start).Seconds())
}

// rsReplicaSet creates the ReplicaSet the pods belong to. No controller runs here, so it creates no pod:
// the scenario creates them, as its controller would name them.
func (s *stack) rsReplicaSet(ctx context.Context) (*appsv1.ReplicaSet, error) {
	return createReplicaSet(ctx, s.c)
}

func createReplicaSet(ctx context.Context, c client.Client) (*appsv1.ReplicaSet, error) {
	labels := map[string]string{"app": "train"}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: rsReplicaSet},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "local/cuda-workload:1"}}}}}}
	return rs, c.Create(ctx, rs)
}

// rsStartPod creates a pod of rs (Running) and its claim of memory (createRSPod), allocates and prepares
// the claim, and starts the workload gated with the claim's CDI edits; the pod is named before the
// workload makes its first CUDA call.
func (s *stack) rsStartPod(ctx context.Context, kubelet *draKubelet, dev sizedDevice, rs *appsv1.ReplicaSet, suffix string, memory resource.Quantity) (*rsPod, error) {
	p := &rsPod{}
	var err error
	if p.pod, p.claim, err = createRSPod(ctx, s.c, rs, suffix, memory); err != nil {
		if p.pod == nil {
			return nil, err
		}
		return p, err
	}
	name := p.pod.Name
	if err := s.podRunning(ctx, p.pod); err != nil {
		return p, err
	}
	if _, err := allocate(ctx, s.c, p.claim, p.pod, dev, nodeName); err != nil {
		return p, err
	}
	ids, err := kubelet.prepare(ctx, p.claim, 30*time.Second)
	if err != nil {
		return p, err
	}
	p.prepared = true
	cdi, err := resolveCDI(s.cdiDir, ids)
	if err != nil {
		return p, err
	}
	e := edits{env: map[string]string{"PEAK_MIB": strconv.Itoa(rsPeakMiB), "SECONDS_RUN": strconv.Itoa(rsSeconds)}, mounts: cdi.edits.mounts}
	for k, v := range cdi.edits.env {
		e.env[k] = v
	}
	workload := shJoin([]string{s.o.python, filepath.Join(s.o.repo, "test/gpu/rightsize/workload.py")})
	if p.c, err = s.startWith(name, e, []string{"/bin/sh", "-c", "read go; exec " + workload}); err != nil {
		return p, err
	}
	if err := s.inPod(p.pod, p.c.pid()); err != nil {
		return p, err
	}
	return p, p.c.command("start")
}

// createRSPod creates a pod of rs, named as its controller names pods, bound to the node, and its claim
// of memory as the kube-controller-manager makes it from the pod's template: controlled by the pod,
// annotated with its pod claim's name.
func createRSPod(ctx context.Context, c client.Client, rs *appsv1.ReplicaSet, suffix string, memory resource.Quantity) (*corev1.Pod, *resourcev1.ResourceClaim, error) {
	name := rs.Name + "-" + suffix
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: rs.Namespace, Name: name, Labels: rs.Spec.Template.Labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: nodeName,
			ResourceClaims: []corev1.PodResourceClaim{{Name: sizedRequest, ResourceClaimTemplateName: ptr.To("train-gpu")}},
			Containers: []corev1.Container{{Name: "main", Image: "local/cuda-workload:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: sizedRequest}}}}}}}
	if err := c.Create(ctx, pod); err != nil {
		return nil, nil, err
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: rs.Namespace, Name: name + "-gpu-x7k2q",
		Annotations:     map[string]string{rightsizing.PodClaimNameAnnotation: sizedRequest},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: sizedRequest,
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpusharing-sized", Capacity: &resourcev1.CapacityRequirements{
				// 10 % of the SMs each: the scenario's five claims fit the device's 100 together.
				Requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: memory, dra.CapacityCompute: resource.MustParse("10")}}}}}}}}
	if err := c.Create(ctx, claim); err != nil {
		return pod, nil, err
	}
	return pod, claim, nil
}

// rsRun waits for the pods' workloads to end, reading NVML's figure of each process every 100 ms, and
// returns the highest memory the agent published for any of their claims meanwhile.
func (s *stack) rsRun(ctx context.Context, pods ...*rsPod) int64 {
	var published int64
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_, g := s.gpuNode(ctx)
			for _, p := range pods {
				if c := sizedClaim(g, p.claim.Name); c != nil && c.MemoryUsed != nil {
					mu.Lock()
					published = max(published, c.MemoryUsed.Value())
					mu.Unlock()
				}
			}
		}
	}()
	deadline := time.After(rsRunTimeout)
	for running := true; running; {
		used := nvmlProcessMemory(ctx, s.o.gpuIndex)
		running = false
		for _, p := range pods {
			p.nvmlPeak = max(p.nvmlPeak, used[p.c.pid()])
			running = running || p.c.running()
		}
		select {
		case <-deadline:
			for _, p := range pods {
				s.killWorkload(p.pod.Name, p.c)
			}
			running = false
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, p := range pods {
		<-p.c.done
		p.exit = exitCode(p.c.err)
	}
	// Once the agent has read the pods' processes gone, every figure it read of them was published.
	_, _ = s.waitGPU(ctx, rsStatusWindow, func(_ *v1alpha1.GPUNode, g *v1alpha1.GPUStatus) bool {
		for _, p := range pods {
			if c := sizedClaim(g, p.claim.Name); c != nil && c.MemoryUsed != nil && c.MemoryUsed.Sign() > 0 {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	return published
}

// rsWatchReports runs p's workload to its end while watching the GPU's status: it returns what reported
// the pod ("" when nothing did): WithinClaims False, or an allocation refused on its claim.
func (s *stack) rsWatchReports(ctx context.Context, p *rsPod) string {
	var mu sync.Mutex
	var reported []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			_, g := s.gpuNode(ctx)
			var why string
			if c := condition(gConditions(g), v1alpha1.ConditionWithinClaims); c != nil && c.Status == metav1.ConditionFalse {
				why = "WithinClaims False: " + c.Message
			}
			if c := sizedClaim(g, p.claim.Name); c != nil && c.AllocationsRefused > 0 {
				why = fmt.Sprintf("%d allocations refused", c.AllocationsRefused)
			}
			if why != "" {
				mu.Lock()
				reported = append(reported, why)
				mu.Unlock()
			}
		}
	}()
	s.rsRun(ctx, p)
	close(stop)
	wg.Wait()
	if len(reported) == 0 {
		return ""
	}
	return reported[0]
}

// rsDeviceStatus checks the claim's own status shows what its pod held: its device's data, with a peak
// within the status threshold of NVML's.
func (s *stack) rsDeviceStatus(ctx context.Context, p *rsPod) {
	var u dra.DeviceUsage
	var last string
	_, err := waitFor(ctx, rsStatusWindow, 200*time.Millisecond, func() bool {
		var c resourcev1.ResourceClaim
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(p.claim), &c); err != nil || len(c.Status.Devices) != 1 || c.Status.Devices[0].Data == nil {
			last = fmt.Sprintf("%v %s", err, jsonOf(c.Status.Devices))
			return false
		}
		last = string(c.Status.Devices[0].Data.Raw)
		if json.Unmarshal(c.Status.Devices[0].Data.Raw, &u) != nil {
			return false
		}
		step := max(int64(256<<20), p.nvmlPeak/20)
		// NVML's bytes here, whole MiB from nvidia-smi.
		return u.PeakMemoryBytes < p.nvmlPeak+(1<<20) && p.nvmlPeak-u.PeakMemoryBytes < step
	}, time.Now())
	s.r.check("the claim's device status shows its pod's peak (kubectl get resourceclaim -o yaml)", err == nil,
		"NVML peak %d MiB; status.devices[0].data %s", p.nvmlPeak>>20, last)
}

// rsRecommendation waits for the recommendation to stand on at least samples pod peaks.
func (s *stack) rsRecommendation(ctx context.Context, samples int64) (*v1alpha1.GPUShareRecommendation, error) {
	var rec v1alpha1.GPUShareRecommendation
	var last string
	_, err := waitFor(ctx, rsStatusWindow, 200*time.Millisecond, func() bool {
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: podNamespace, Name: rsRecName}, &rec); err != nil {
			last = err.Error()
			return false
		}
		last = jsonOf(rec.Status)
		return rec.Status.Samples >= samples && rec.Status.Memory != nil && rec.Status.Memory.Target != nil && rec.Status.InitialMemory != nil
	}, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, last)
	}
	return &rec, nil
}

// rsPrintTable prints kubectl's table of the recommendations, as a user sees it.
func (s *stack) rsPrintTable(ctx context.Context) {
	out, err := s.kubectl(ctx, "get", "gpusharerecommendations", "-n", podNamespace)
	if err != nil {
		fmt.Println("kubectl get gpusharerecommendations:", err)
		return
	}
	fmt.Print(out)
}

// rsCleanup ends the scenario's workloads, unprepares its claims and deletes its objects and policy:
// no controller here collects what the pods and the ReplicaSet own.
func (s *stack) rsCleanup(ctx context.Context, kubelet *draKubelet, pods []*rsPod) {
	for _, p := range pods {
		s.killWorkload(p.pod.Name, p.c)
		if p.prepared && p.claim != nil {
			_ = kubelet.unprepare(ctx, p.claim)
		}
	}
	var errs []error
	for _, p := range pods {
		errs = append(errs, client.IgnoreNotFound(s.c.Delete(ctx, p.pod, client.GracePeriodSeconds(0))))
		if p.claim != nil {
			errs = append(errs, client.IgnoreNotFound(s.c.Delete(ctx, p.claim)))
		}
	}
	errs = append(errs, client.IgnoreNotFound(s.c.Delete(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: rsReplicaSet}})),
		client.IgnoreNotFound(s.c.Delete(ctx, &v1alpha1.GPUShareRecommendation{ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: rsRecName}})))
	s.r.must("delete the scenario's pods, claims, ReplicaSet and recommendation", errors.Join(errs...))
	s.sizedPolicyDeleted(ctx)
}

// sizedClaim is the claim's entry in the GPU's sized status (nil: not listed).
func sizedClaim(g *v1alpha1.GPUStatus, name string) *v1alpha1.SizedClaimStatus {
	if g == nil || g.Sized == nil {
		return nil
	}
	for i := range g.Sized.Claims {
		if g.Sized.Claims[i].Name == name {
			return &g.Sized.Claims[i]
		}
	}
	return nil
}

func gConditions(g *v1alpha1.GPUStatus) []metav1.Condition {
	if g == nil {
		return nil
	}
	return g.Conditions
}

// nvmlProcessMemory is NVML's memory of each process on the GPU (bytes), as nvidia-smi lists them.
func nvmlProcessMemory(ctx context.Context, index int) map[int]int64 {
	out := map[int]int64{}
	for _, line := range strings.Split(smiQuery(ctx, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits", "-i", strconv.Itoa(index)), "\n") {
		pid, mem, ok := strings.Cut(line, ",")
		if !ok {
			continue
		}
		p, err1 := strconv.Atoi(strings.TrimSpace(pid))
		m, err2 := strconv.ParseInt(strings.TrimSpace(mem), 10, 64)
		if err1 == nil && err2 == nil {
			out[p] = m << 20
		}
	}
	return out
}

// exitCode is a workload's exit status from its Wait error (-1: it did not exit on its own).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
