// Package owner decides, on a node where the agent serves the device plugin and DRA at once, which of
// the two hands out each GPU. Both interfaces cut the same GPUs into the same capacity (an exclusive GPU,
// N replicas each promised 1/N of the memory, MIG instances), so a GPU served by both at once would be
// given out twice. The rule is first come, first served, decided by what is held:
//   - a unit is held by the device plugin while a pod holds one of its devices in the kubelet's
//     PodResources, or an Allocate of one returned lately (the kubelet records it a moment later);
//   - a unit is held by DRA while the kubelet plugin has a claim prepared (or being prepared) on it.
//
// The unit is the physical GPU, except for a MIG instance, which is allocated whole and is its own unit:
// a device plugin pod on one instance and a claim on another instance of the same GPU share nothing.
//
// Both sides decide under the one lock of Owners, so an Allocate and a prepare racing for one GPU give
// it to exactly one of them. Where only one interface runs there is no Owners and nothing is looked up.
package owner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/deviceid"
	"github.com/gpusharing/gpusharing/agent/podres"
	"github.com/gpusharing/gpusharing/agent/share"
)

var (
	// ErrHeldByDevicePlugin: a claim names a GPU a device plugin pod holds. The kubelet retries the
	// prepare; the claim's pod waits until the device plugin pod is gone.
	ErrHeldByDevicePlugin = errors.New("GPU held by the device plugin")
	// ErrHeldByDRA: the kubelet allocated a device plugin device of a GPU a prepared ResourceClaim holds.
	ErrHeldByDRA = errors.New("GPU held by a ResourceClaim")
	// ErrUnknownHolders: the kubelet's PodResources could not be read, so nobody can tell whether a
	// device plugin pod holds the GPU; the claim is not prepared (the kubelet retries).
	ErrUnknownHolders = errors.New("cannot tell which pods hold the GPU")
)

// DefaultInFlightGrace is how long an Allocate counts as holding its GPU when the kubelet's PodResources
// does not show it: the kubelet records an allocation right after Allocate returns, and forgets one whose
// pod it then rejects.
const DefaultInFlightGrace = 30 * time.Second

// listTimeout bounds one read of the kubelet's PodResources made for a prepare.
const listTimeout = 2 * time.Second

// Lister is the part of the kubelet's PodResources v1 API that tells which devices pods hold; the
// generated client satisfies it.
type Lister = podres.Lister

// Claim is a ResourceClaim holding units through DRA.
type Claim struct {
	UID             types.UID
	Namespace, Name string
	// Units are the GPU and MIG instance uuids its devices are on (UnitOf).
	Units []string
}

// UnitOf is the unit a device is served from: its MIG instance's uuid, else its physical GPU's.
func UnitOf(d share.Device) string {
	if d.Kind == share.KindMIG {
		return d.VisibleUUID
	}
	return d.GPUUUID
}

// Owners holds the picture of which interface holds which unit. Its zero value is not usable: see New.
type Owners struct {
	lister Lister
	grace  time.Duration
	clock  clock.PassiveClock

	mu sync.Mutex
	// claims are the claims the kubelet plugin has prepared or is preparing.
	claims map[types.UID]Claim
	// allocs are when the device plugin last allocated a device of each unit.
	allocs map[string]time.Time
	// pods are the pods (namespace/name) holding each unit in the latest read of PodResources, begun at
	// podsAt.
	pods   map[string]string
	podsAt time.Time
	// changed is signalled when the units held by DRA change.
	changed chan struct{}
	// allocated is signalled when an Allocate takes a unit, so Watch reads PodResources again.
	allocated chan struct{}
}

// New returns Owners reading the device plugin's pods from lister. grace zero is DefaultInFlightGrace; a
// nil clock is the real one.
func New(lister Lister, grace time.Duration, clk clock.PassiveClock) *Owners {
	if grace <= 0 {
		grace = DefaultInFlightGrace
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Owners{lister: lister, grace: grace, clock: clk, claims: map[types.UID]Claim{}, allocs: map[string]time.Time{},
		pods: map[string]string{}, changed: make(chan struct{}, 1), allocated: make(chan struct{}, 1)}
}

// Changed is signalled (never blocking, coalesced) whenever the units held by DRA change, so the device
// plugin marks their devices Unhealthy or Healthy again.
func (o *Owners) Changed() <-chan struct{} { return o.changed }

// TakeForClaim gives c its units unless the device plugin holds one of them. It reads the kubelet's
// PodResources first (outside the lock: an Allocate never waits for the kubelet), then decides under the
// lock with that read and the allocations made since, and records c as holding its units before it
// returns, so an Allocate that comes next is refused. A claim already recorded gets the union of units.
func (o *Owners) TakeForClaim(ctx context.Context, c Claim) error {
	if len(c.Units) == 0 {
		return nil
	}
	began := o.clock.Now()
	pods, err := o.list(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w %s: %w; the claim waits (the kubelet retries preparing it)", ErrUnknownHolders, strings.Join(c.Units, ", "), err)
	}
	o.observeLocked(pods, began)
	for _, unit := range c.Units {
		if pod := pods[unit]; pod != "" {
			return fmt.Errorf("%w: %s is held by device plugin pod %s; the claim waits until that pod is gone (the kubelet retries preparing it)", ErrHeldByDevicePlugin, unit, pod)
		}
		if _, ok := o.allocs[unit]; ok {
			return fmt.Errorf("%w: %s was allocated to a pod the kubelet is admitting through the device plugin; the claim waits until that pod is gone (the kubelet retries preparing it)", ErrHeldByDevicePlugin, unit)
		}
	}
	held := o.claims[c.UID]
	next := Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Units: union(held.Units, c.Units)}
	o.claims[c.UID] = next
	if !slices.Equal(held.Units, next.Units) {
		o.signal()
	}
	return nil
}

// TakeForDevicePlugin records an Allocate of devices on units unless a claim holds one of them; it never
// waits for the kubelet.
func (o *Owners) TakeForDevicePlugin(units []string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, unit := range units {
		if c, ok := o.heldByDRALocked(unit); ok {
			return fmt.Errorf("%w: %s is held by ResourceClaim %s/%s through DRA; its devices are Unhealthy here until the claim is unprepared", ErrHeldByDRA, unit, c.Namespace, c.Name)
		}
	}
	now := o.clock.Now()
	for _, unit := range units {
		o.allocs[unit] = now
	}
	if len(units) > 0 {
		select {
		case o.allocated <- struct{}{}:
		default:
		}
	}
	return nil
}

// HeldByDevicePlugin says whether a device plugin pod held unit at the latest read of PodResources, or an
// Allocate of it is in flight: the ResourceSlices leave such a unit out, so the kube-scheduler allocates
// no claim that could only wait.
func (o *Owners) HeldByDevicePlugin(unit string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, inFlight := o.allocs[unit]
	return inFlight || o.pods[unit] != ""
}

// Watch reads PodResources every interval, and right after an Allocate, until ctx ends, and calls
// onChange (which must not block) whenever the units HeldByDevicePlugin reports change. A failed read
// keeps the last picture.
func (o *Owners) Watch(ctx context.Context, interval time.Duration, onChange func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last []string
	for {
		// A failed read keeps the last picture; the next tick reads again.
		_ = o.Refresh(ctx)
		o.mu.Lock()
		held := o.heldByDevicePluginLocked()
		o.mu.Unlock()
		if !slices.Equal(held, last) {
			last = held
			onChange()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-o.allocated:
		}
	}
}

// Refresh reads the kubelet's PodResources once into the picture HeldByDevicePlugin answers from: the
// agent calls it before anything serves, so a restarted agent publishes no GPU a device plugin pod holds.
func (o *Owners) Refresh(ctx context.Context) error {
	began := o.clock.Now()
	pods, err := o.list(ctx)
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.observeLocked(pods, began)
	return nil
}

// observeLocked takes a read of PodResources begun at began. A read begun after an allocation answers
// for it once it shows a pod holding the unit, or once the kubelet has had its time to record it.
func (o *Owners) observeLocked(pods map[string]string, began time.Time) {
	now := o.clock.Now()
	for unit, at := range o.allocs {
		if at.Before(began) && (pods[unit] != "" || now.Sub(at) >= o.grace) {
			delete(o.allocs, unit)
		}
	}
	if !began.Before(o.podsAt) {
		o.pods, o.podsAt = pods, began
	}
}

func (o *Owners) heldByDevicePluginLocked() []string {
	out := slices.Collect(maps.Keys(o.allocs))
	for unit, pod := range o.pods {
		if pod != "" {
			out = append(out, unit)
		}
	}
	return union(nil, out)
}

// HeldByDRA names the claim (namespace/name) holding unit, if one does.
func (o *Owners) HeldByDRA(unit string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c, ok := o.heldByDRALocked(unit)
	if !ok {
		return "", false
	}
	return c.Namespace + "/" + c.Name, true
}

// Release forgets claim uid (its prepare failed, or it was unprepared).
func (o *Owners) Release(uid types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.claims[uid]; ok {
		delete(o.claims, uid)
		o.signal()
	}
}

// SetClaims replaces DRA's side with claims, the kubelet plugin's checkpoint: on start, and after every
// change of it.
func (o *Owners) SetClaims(claims []Claim) {
	next := make(map[types.UID]Claim, len(claims))
	for _, c := range claims {
		c.Units = union(nil, c.Units)
		next[c.UID] = c
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if maps.EqualFunc(o.claims, next, func(a, b Claim) bool { return slices.Equal(a.Units, b.Units) }) {
		o.claims = next
		return
	}
	o.claims = next
	o.signal()
}

func (o *Owners) heldByDRALocked(unit string) (Claim, bool) {
	// Several claims can hold one unit (replicas of one GPU); the first by uid names them.
	for _, uid := range slices.Sorted(maps.Keys(o.claims)) {
		if c := o.claims[uid]; slices.Contains(c.Units, unit) {
			return c, true
		}
	}
	return Claim{}, false
}

func (o *Owners) signal() {
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

// list reads which pod (namespace/name) holds a device of each unit. Any resource counts, as for the
// drain: whichever plugin allocated the device, the pod holds the unit.
func (o *Owners) list(ctx context.Context) (map[string]string, error) {
	if o.lister == nil {
		return nil, errors.New("no PodResources API to read")
	}
	resp, err := podres.List(ctx, o.lister, listTimeout)
	if err != nil {
		return nil, err
	}
	pods := map[string]string{}
	for d := range podres.Devices(resp) {
		if unit := deviceid.Parse(d.ID).UUID; pods[unit] == "" {
			pods[unit] = d.Namespace + "/" + d.Pod
		}
	}
	return pods, nil
}

func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
