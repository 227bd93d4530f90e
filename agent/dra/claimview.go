package dra

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The claim guard judges a pod only against claims it knows whole. The checkpoint knows the claims this
// plugin prepared, with the pods they were reserved for at that moment; it does not know a pod that
// started using a shared claim later (the kubelet prepares a claim once per node, not once per pod), nor,
// after it was moved aside as unreadable, any claim at all. So the plugin also reads the ResourceClaims
// allocated in this node's pool from the API server: once before it serves, and again when the guard
// asks (RequestClaimSync), at most every ClaimSyncInterval.
const (
	// ClaimSyncInterval is the least time between two reads of the node's claims.
	ClaimSyncInterval = 2 * time.Second
	// claimSyncTimeout bounds one read (all its pages).
	claimSyncTimeout = 10 * time.Second
)

// ClaimView is what the plugin knows of the claims on this node's sized GPUs.
type ClaimView struct {
	// Claims are the claims whose GPU and amounts are known: those the checkpoint holds and those the
	// last read of the API server found allocated in this node's pool, each with the pods of both.
	Claims []SizedClaim
	// Uncertain are pods named by a claim of a sized device whose GPU or amounts are not known yet (an
	// entry written without them, a GPU the agent has not listed yet): their use cannot be judged.
	Uncertain []types.NamespacedName
	// SyncedAt is when the last read of the node's claims from the API server began; zero before the
	// first. A pod that ran on a GPU before then was in the reservedFor of every claim it uses by then
	// (the scheduler reserves a claim before it binds the pod).
	SyncedAt time.Time
}

// apiClaim is a claim allocated in this node's pool as the API server last showed it.
type apiClaim struct {
	namespace, name string
	pods            []string
	podUIDs         []types.UID
	devices         []preparedDevice
}

// ClaimView lists the claims of sized GPUs the plugin knows, merged from its checkpoint and its last read
// of the API server, ordered by GPU, namespace and name.
func (p *KubeletPlugin) ClaimView() ClaimView {
	p.mu.Lock()
	defer p.mu.Unlock()
	view := ClaimView{SyncedAt: p.syncedAt}
	uncertain := map[types.NamespacedName]bool{}
	add := func(uid types.UID, namespace, name string, pods []string, podUIDs []types.UID, devices []preparedDevice, fallback []preparedDevice) {
		byGPU := map[string]int{}
		for _, d := range devices {
			index, sized := SizedIndex(d.Device)
			if !sized && d.GPU == "" {
				continue
			}
			gpu := d.GPU
			if gpu == "" && sized {
				gpu = p.gpus[index]
			}
			mem, compute := d.MemoryBytes, d.ComputePercent
			if mem <= 0 {
				// An entry written without its amounts: the API server's, where read.
				for _, f := range fallback {
					if f.Device == d.Device && f.MemoryBytes > 0 {
						mem, compute = f.MemoryBytes, f.ComputePercent
					}
				}
			}
			if gpu == "" || mem <= 0 {
				for _, pod := range pods {
					uncertain[types.NamespacedName{Namespace: namespace, Name: pod}] = true
				}
				continue
			}
			i, ok := byGPU[gpu]
			if !ok {
				i = len(view.Claims)
				byGPU[gpu] = i
				view.Claims = append(view.Claims, SizedClaim{UID: uid, Namespace: namespace, Name: name, Pods: pods, PodUIDs: podUIDs, GPU: gpu})
			}
			view.Claims[i].MemoryBytes += mem
			view.Claims[i].ComputePercent += compute
		}
	}
	for uid, pc := range p.cp.Claims {
		a := p.api[uid]
		pods := slices.Concat(pc.Pods, a.pods)
		slices.Sort(pods)
		add(uid, pc.Namespace, pc.Name, slices.Compact(pods), mergeUIDs(pc.PodUIDs, a.podUIDs), pc.Devices, a.devices)
	}
	for uid, a := range p.api {
		if _, ok := p.cp.Claims[uid]; !ok {
			add(uid, a.namespace, a.name, slices.Clone(a.pods), mergeUIDs(a.podUIDs), a.devices, nil)
		}
	}
	slices.SortFunc(view.Claims, func(a, b SizedClaim) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	for n := range uncertain {
		view.Uncertain = append(view.Uncertain, n)
	}
	slices.SortFunc(view.Uncertain, func(a, b types.NamespacedName) int { return cmp.Compare(a.String(), b.String()) })
	return view
}

// SizedIndex is the GPU index of a sized device's name (gpu-<index>-sized).
func SizedIndex(device string) (int32, bool) {
	var index int32
	var rest string
	if n, _ := fmt.Sscanf(device, "gpu-%d-%s", &index, &rest); n != 2 || rest != "sized" || device != fmt.Sprintf("gpu-%d-sized", index) {
		return 0, false
	}
	return index, true
}

// SyncClaims reads the ResourceClaims allocated in this node's pool (uncached, claimPageSize a page) and
// keeps, for each holding a sized device, the amounts it consumes and the pods it is reserved for. On
// success the view's SyncedAt is when the read began; on an error the last read stays.
func (p *KubeletPlugin) SyncClaims(ctx context.Context, kube kubernetes.Interface) error {
	began := p.now()
	found := map[types.UID]apiClaim{}
	cont := ""
	for {
		list, err := kube.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{Limit: claimPageSize, Continue: cont})
		if err != nil {
			return fmt.Errorf("listing ResourceClaims: %w", err)
		}
		for i := range list.Items {
			c := &list.Items[i]
			if c.Status.Allocation == nil {
				continue
			}
			var devices []preparedDevice
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver != DriverName || r.Pool != p.node {
					continue
				}
				if _, sized := SizedIndex(r.Device); sized {
					d := sizedAmounts("", r.ConsumedCapacity)
					d.Device, d.Pool = r.Device, r.Pool
					devices = append(devices, d)
				}
			}
			if len(devices) > 0 {
				found[c.UID] = apiClaim{namespace: c.Namespace, name: c.Name, pods: reservedPods(c), podUIDs: reservedPodUIDs(c), devices: devices}
			}
		}
		if cont = list.Continue; cont == "" {
			break
		}
	}
	p.mu.Lock()
	for uid := range p.unprepared {
		if _, ok := found[uid]; ok {
			delete(found, uid)
		} else {
			delete(p.unprepared, uid) // deallocated or gone: nothing left to keep out
		}
	}
	p.api, p.syncedAt = found, began
	p.mu.Unlock()
	if p.OnChange != nil {
		p.OnChange()
	}
	return nil
}

// RequestClaimSync asks for a read of the node's claims without waiting for it: the claim guard asks when
// a pod on a sized GPU cannot be judged yet. Requests made while one is pending are one request.
func (p *KubeletPlugin) RequestClaimSync() {
	select {
	case p.syncRequests <- struct{}{}:
	default:
	}
}

// syncClaimsOnRequest serves RequestClaimSync until ctx ends, at most one read per ClaimSyncInterval.
func (p *KubeletPlugin) syncClaimsOnRequest(ctx context.Context, kube kubernetes.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.syncRequests:
		}
		sctx, cancel := context.WithTimeout(ctx, claimSyncTimeout)
		if err := p.SyncClaims(sctx, kube); err != nil && ctx.Err() == nil {
			p.log.Error(err, "Cannot read this node's ResourceClaims; pods on sized GPUs not known stay unjudged")
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(ClaimSyncInterval):
		}
	}
}

// now is the plugin's clock.
func (p *KubeletPlugin) now() time.Time {
	if p.Clock != nil {
		return p.Clock.Now()
	}
	return time.Now()
}

// allocatedHere says whether a claim's allocation names a device of this driver in this node's pool.
func (p *KubeletPlugin) allocatedHere(c *resourcev1.ResourceClaim) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.Pool == p.node {
			return true
		}
	}
	return false
}
