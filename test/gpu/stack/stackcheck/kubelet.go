package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/testenv"
)

const podNamespace = "default"

// podTable is the kubelet's PodResources view: which pod's container holds which devices.
type podTable struct {
	res  *fakekubelet.PodResources
	mu   sync.Mutex
	pods map[string]*podresourcesv1.PodResources
}

func (t *podTable) set(name, resource string, ids []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pods == nil {
		t.pods = map[string]*podresourcesv1.PodResources{}
	}
	t.pods[name] = &podresourcesv1.PodResources{Name: name, Namespace: podNamespace, Containers: []*podresourcesv1.ContainerResources{{
		Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
	}}}
	t.publishLocked()
}

// ids are the device IDs the pod's container holds.
func (t *podTable) ids(name string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	if p := t.pods[name]; p != nil {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				out = append(out, d.GetDeviceIds()...)
			}
		}
	}
	return out
}

func (t *podTable) remove(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pods, name)
	t.publishLocked()
}

func (t *podTable) publishLocked() {
	var all []*podresourcesv1.PodResources
	for _, p := range t.pods {
		all = append(all, p)
	}
	t.res.SetPods(all...)
}

// allocation is what the kubelet got for one container: the device IDs it picked and Allocate's answer.
type allocation struct {
	resource string
	ids      []string
	resp     *pluginapi.ContainerAllocateResponse
}

// allocate does what the kubelet's device manager does for a container asking for n of resource: pick
// from the healthy devices not in use (asking the plugin's preferred allocation), then Allocate.
func (s *stack) allocate(ctx context.Context, resource string, n int, inUse map[string]bool) (*allocation, error) {
	var free []string
	for id, health := range s.kubelet.Devices(resource) {
		if health == pluginapi.Healthy && !inUse[id] {
			free = append(free, id)
		}
	}
	sort.Strings(free)
	if len(free) < n {
		return nil, fmt.Errorf("%s: %d free devices, want %d", resource, len(free), n)
	}
	p, err := s.kubelet.Dial(resource)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids, err := p.Preferred(ctx, free, nil, n)
	if err != nil || len(ids) != n {
		ids = free[:n]
	}
	resp, err := p.AllocateOne(ctx, ids...)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's Allocate of %v: %w", ids, err)
	}
	for _, id := range ids {
		inUse[id] = true
	}
	return &allocation{resource: resource, ids: ids, resp: resp}, nil
}

// admitPod does the kubelet's part for a pod whose container got alloc: the Pod object is Running and
// Ready in the API, and PodResources lists its devices (which the agent's drain reads).
func (s *stack) admitPod(ctx context.Context, name string, alloc *allocation) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Image: "local/cuda-workload:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(alloc.resource): *resourceQty(len(alloc.ids))}}}}},
	}
	if err := s.c.Create(ctx, pod); err != nil {
		return err
	}
	if err := testenv.WritePodPhase(ctx, s.c, pod, corev1.PodRunning); err != nil {
		return err
	}
	s.pods.set(name, alloc.resource, alloc.ids)
	return nil
}

// podEnded is what the kubelet does when a pod's container exits: the pod's devices leave PodResources
// and the pod reports Succeeded.
func (s *stack) podEnded(ctx context.Context, name string) error {
	s.pods.remove(name)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: name}}
	return testenv.WritePodPhase(ctx, s.c, pod, corev1.PodSucceeded)
}

// containerID is the runtime id of a pod's one container here: stable per pod name, 64 hex digits as
// containerd's.
func containerID(pod string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(pod))) }

// podRunning writes what a kubelet reports for a pod whose container runs: Running, Ready, and the
// container's runtime id, by which the agent's accounting names the container of a process.
func (s *stack) podRunning(ctx context.Context, pod *corev1.Pod) error {
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + containerID(pod.Name), Ready: true}}}
	return s.c.Status().Update(ctx, pod)
}

// inPod makes pid a process of the pod's container for the agent: this machine has no kubelet to put it
// in the pod's cgroup, so the process's cgroup file under the agent's --proc-root says what a kubelet's
// container would (cgroupfs layout, the pod's UID, the container's id).
func (s *stack) inPod(pod *corev1.Pod, pid int) error {
	dir := filepath.Join(s.procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	line := fmt.Sprintf("0::/kubepods/besteffort/pod%s/%s\n", pod.UID, containerID(pod.Name))
	return os.WriteFile(filepath.Join(dir, "cgroup"), []byte(line), 0o644)
}
