package podpid

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Where says what a process's cgroup tells of its pod.
type Where int

const (
	// OnHost: the cgroup names no pod (a host process: the MPS server, nvidia-smi, a host tool).
	OnHost Where = iota
	// InPod: the process runs in a pod this node's list has.
	InPod
	// InUnlistedPod: the cgroup names a pod this node's list does not have (yet, or the list failed
	// within the lookup's deadline, or a static pod, whose UID no API object carries).
	InUnlistedPod
	// Unreadable: the cgroup could not be read (the process has exited, or ProcRoot is not the host's).
	Unreadable
)

// Pod is what the resolver knows of the pod a process runs in.
type Pod struct {
	UID, Namespace, Name string
	// Claims are the names of the ResourceClaims, in Namespace, the pod uses: those spec.resourceClaims
	// name, those status.resourceClaimStatuses records for its templates, and the one
	// status.extendedResourceClaimStatus records for extended resources served through DRA.
	Claims []string
}

// PodOf returns the pod pid runs in, and where the process is. A pod UID the last list did not have makes
// it list again (at most once per priorityRelist, as for Priority, since a new pod's first process must
// not wait for MinRelist), waiting no longer than ctx.
func (r *Resolver) PodOf(ctx context.Context, pid int32) (Pod, Where) {
	procRoot := r.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	uid, where := podUIDOf(procRoot, pid)
	if where != InPod {
		return Pod{}, where
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, known := r.byUID[uid]; !known && (r.listing != nil || r.lastList.IsZero() || r.clock().Since(r.lastList) >= priorityRelist) {
		r.refreshLocked(ctx)
	}
	name, known := r.byUID[uid]
	if !known {
		return Pod{UID: uid}, InUnlistedPod
	}
	ns, n, _ := strings.Cut(name, "/")
	return Pod{UID: uid, Namespace: ns, Name: n, Claims: r.claimsByUID[uid]}, InPod
}

// podUIDOf reads procRoot/<pid>/cgroup: InPod with the pod's UID, OnHost where no line names a pod,
// Unreadable where the file cannot be read.
func podUIDOf(procRoot string, pid int32) (string, Where) {
	f, err := os.Open(filepath.Join(procRoot, fmt.Sprint(pid), "cgroup"))
	if err != nil {
		return "", Unreadable
	}
	defer func() { _ = f.Close() }() // read-only: a close error loses nothing
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := podUID.FindStringSubmatch(sc.Text()); m != nil {
			return strings.ReplaceAll(m[1], "_", "-"), InPod
		}
	}
	if sc.Err() != nil {
		return "", Unreadable
	}
	return "", OnHost
}

// claimNames lists the ResourceClaims pod p uses (Pod.Claims), sorted, each once.
func claimNames(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.ResourceClaims {
		if c.ResourceClaimName != nil && *c.ResourceClaimName != "" {
			out = append(out, *c.ResourceClaimName)
		}
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil && *s.ResourceClaimName != "" {
			out = append(out, *s.ResourceClaimName)
		}
	}
	if s := p.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		out = append(out, s.ResourceClaimName)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
