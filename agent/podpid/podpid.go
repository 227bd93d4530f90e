// Package podpid names the pod behind a host process id. The shim's scheduler knows its clients by the
// pid the kernel reports for their socket (the agent runs in the host PID namespace); people reading
// GPUNode status want the pod. The kubelet puts each pod's containers in a cgroup whose path carries the
// pod's UID, and the API server maps the UID to namespace/name.
package podpid

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// podUID matches the pod segment of a kubelet cgroup path in both drivers' spellings:
// cgroupfs ".../kubepods/burstable/pod1b2c3d4e-...-.../<container>" and systemd
// ".../kubepods-burstable-pod1b2c3d4e_..._....slice/cri-containerd-<id>.scope" (dashes become '_').
var podUID = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// UIDOf reads procRoot/<pid>/cgroup and returns the UID of the pod the process runs in; ok is false for
// a process outside any pod (or one that has exited).
func UIDOf(procRoot string, pid int32) (uid string, ok bool) {
	f, err := os.Open(filepath.Join(procRoot, fmt.Sprint(pid), "cgroup"))
	if err != nil {
		return "", false
	}
	defer func() { _ = f.Close() }() // read-only: a close error loses nothing
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := podUID.FindStringSubmatch(sc.Text()); m != nil {
			return strings.ReplaceAll(m[1], "_", "-"), true
		}
	}
	return "", false
}

// Resolver maps pids to "namespace/name" through the pods the API server lists on this node. It lists
// again only when it meets a UID it does not know, at most once per MinRelist, so a steady set of
// clients costs no API call.
type Resolver struct {
	// Reader lists pods; use an uncached reader (the manager's APIReader) so the agent does not cache
	// every pod of the cluster.
	Reader client.Reader
	// NodeName restricts the list to this node's pods.
	NodeName string
	// ProcRoot is the proc filesystem; default /proc.
	ProcRoot string
	// MinRelist bounds how often unknown UIDs trigger a list; default 10s.
	MinRelist time.Duration
	// Clock decides when a list is due; nil means the real clock.
	Clock clock.PassiveClock

	mu       sync.Mutex
	listing  chan struct{} // closed when the list in flight ends; nil when none is (refreshLocked)
	byUID    map[string]string
	prioByID map[string]int32 // each pod's spec.priority (priority.go)
	// claimsByUID are each pod's ResourceClaim names (pod.go)
	claimsByUID map[string][]string
	// containers maps runtime container ids to container names (containers.go)
	containers map[string]string
	lastList   time.Time
}

// Names returns the pod of each pid it can name; pids outside pods, or in pods it cannot find, are left out.
func (r *Resolver) Names(ctx context.Context, pids []int32) map[int32]string {
	procRoot := r.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	uids := map[int32]string{}
	for _, pid := range pids {
		if uid, ok := UIDOf(procRoot, pid); ok {
			uids[pid] = uid
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unknown(uids) && (r.listing != nil || r.mayList()) {
		r.refreshLocked(ctx)
	}
	out := map[int32]string{}
	for pid, uid := range uids {
		if name, ok := r.byUID[uid]; ok {
			out[pid] = name
		}
	}
	return out
}

func (r *Resolver) unknown(uids map[int32]string) bool {
	for _, uid := range uids {
		if _, ok := r.byUID[uid]; !ok {
			return true
		}
	}
	return false
}

func (r *Resolver) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

func (r *Resolver) mayList() bool {
	minRelist := r.MinRelist
	if minRelist == 0 {
		minRelist = 10 * time.Second
	}
	return r.lastList.IsZero() || r.clock().Since(r.lastList) >= minRelist
}

// listTimeout bounds one list of this node's pods.
const listTimeout = 5 * time.Second

// refreshLocked lists this node's pods again, or joins the list already in flight, and waits for it at
// most until ctx ends. The list runs on its own, bounded by listTimeout and without r.mu, so a lookup
// waits no longer than its own deadline whatever other callers wait for: the scheduler's lookups run
// between a client's HELLO and its WELCOME, which the shim waits for only GPUSHARE_CONNECT_TIMEOUT_MS.
// r.mu held on entry and on return, dropped while waiting.
func (r *Resolver) refreshLocked(ctx context.Context) {
	if r.listing == nil {
		r.listing = make(chan struct{})
		r.lastList = r.clock().Now()
		go r.list(r.listing)
	}
	done := r.listing
	r.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
	r.mu.Lock()
}

// list replaces the UID map with this node's pods and ends the list in flight (done); on an error the
// old map stays (names go stale, the status shows no pod rather than a wrong one only for pods that are
// gone).
func (r *Resolver) list(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	var pods corev1.PodList
	err := r.Reader.List(ctx, &pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", r.NodeName)})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listing = nil
	close(done)
	if err != nil {
		return
	}
	byUID := make(map[string]string, len(pods.Items))
	prio := make(map[string]int32, len(pods.Items))
	claims := map[string][]string{}
	containers := map[string]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		containerNames(p, containers)
		byUID[string(p.UID)] = p.Namespace + "/" + p.Name
		if p.Spec.Priority != nil {
			prio[string(p.UID)] = *p.Spec.Priority
		}
		if c := claimNames(p); len(c) > 0 {
			claims[string(p.UID)] = c
		}
	}
	r.byUID, r.prioByID, r.claimsByUID, r.containers = byUID, prio, claims, containers
}
