package podpid

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Ref names the container a process runs in.
type Ref struct {
	Namespace, Name, Container string
	UID                        string
	// Priority is the pod's spec.priority as the API server resolved it (0 where it has none).
	Priority int32
}

// String is "namespace/name".
func (r Ref) String() string { return r.Namespace + "/" + r.Name }

// containerID matches the container segment that follows the pod's in a kubelet cgroup path: a 64-hex
// runtime id, bare under cgroupfs (".../pod<uid>/<id>") or in a scope under systemd
// (".../cri-containerd-<id>.scope", "crio-<id>.scope", "docker-<id>.scope").
var containerID = regexp.MustCompile(`/(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?(?:/|$)`)

// ContainerOf reads procRoot/<pid>/cgroup and returns the pod UID and the runtime's container id of
// the process; ok is false outside a pod. The container id is empty where the path names none (a
// pod-level cgroup, a runtime that spells it otherwise).
func ContainerOf(procRoot string, pid int32) (uid, container string, ok bool) {
	f, err := os.Open(filepath.Join(procRoot, fmt.Sprint(pid), "cgroup"))
	if err != nil {
		return "", "", false
	}
	defer func() { _ = f.Close() }() // read-only: a close error loses nothing
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		loc := podUID.FindStringSubmatchIndex(line)
		if loc == nil {
			continue
		}
		uid = strings.ReplaceAll(line[loc[2]:loc[3]], "_", "-")
		if m := containerID.FindStringSubmatch(line[loc[1]:]); m != nil {
			container = m[1]
		}
		return uid, container, true
	}
	return "", "", false
}

// Refs returns the pod and container of each pid it can name; pids outside pods, or in pods it cannot
// find, are left out. A pid whose container id the pod's status does not list (yet) keeps an empty
// Container. Like Names, it lists pods again only for a pod UID or container id it does not know, at
// most once per MinRelist.
func (r *Resolver) Refs(ctx context.Context, pids []int32) map[int32]Ref {
	procRoot := r.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	type found struct{ uid, container string }
	ids := make(map[int32]found, len(pids))
	uids := make(map[int32]string, len(pids))
	for _, pid := range pids {
		if uid, c, ok := ContainerOf(procRoot, pid); ok {
			ids[pid] = found{uid, c}
			uids[pid] = uid
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	newContainer := false
	for _, f := range ids {
		if _, known := r.containers[f.container]; f.container != "" && !known {
			newContainer = true // a container started (or restarted) after the last list
		}
	}
	if (newContainer || r.unknown(uids)) && (r.listing != nil || r.mayList()) {
		r.refreshLocked(ctx)
	}
	out := make(map[int32]Ref, len(ids))
	for pid, f := range ids {
		name, ok := r.byUID[f.uid]
		if !ok {
			continue
		}
		ns, pod, _ := strings.Cut(name, "/")
		out[pid] = Ref{Namespace: ns, Name: pod, UID: f.uid, Container: r.containers[f.container], Priority: r.prioByID[f.uid]}
	}
	return out
}

// containerNames maps each runtime container id of the pod's status to the container's name.
func containerNames(p *corev1.Pod, into map[string]string) {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			// "containerd://<id>", "cri-o://<id>", "docker://<id>"
			if _, id, ok := strings.Cut(cs.ContainerID, "://"); ok && id != "" {
				into[id] = cs.Name
			}
		}
	}
}
