package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	"github.com/gpusharing/gpusharing/controllers/testutil/agentsim"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// agents plays every node's agent from one informer on GPUNodes (an informer, not a bare watch: the API
// server closes a watch whose reader falls behind, and the informer lists and watches again): each spec
// change is acked at once (status reports it applied) by a pool of workers with their own client. The
// same events tell when every spec carries a target policy generation.
type agents struct {
	c      client.Client
	cancel context.CancelFunc
	o      options

	mu     sync.Mutex
	latest map[string]*v1.GPUNode
	queued map[string]bool
	queue  chan string
	// targetGen and targetHash are the policy generation and sharing hash every spec should reach;
	// reached closes when every node's spec does.
	targetGen  int64
	targetHash string
	atTarget   map[string]bool
	reached    chan struct{}
	// ackHash and ackGen are what every GPU's status should report applied; acked closes when every
	// node's does (the floor's "Ready": there is no policy status without a controller).
	ackGen   int64
	ackHash  string
	atAck    map[string]bool
	acked    chan struct{}
	watchAck bool
	// disrupted holds the nodes whose spec lists a sharing their agent has not acked yet, as this
	// informer sees them; maxDisrupted is its largest size since the last resetCounts.
	disrupted    map[string]bool
	maxDisrupted int
	// applies counts, per GPU (node/uuid), the acks that changed what the GPU runs since resetCounts:
	// exactly one per GPU in a rollout, more means a GPU was configured twice.
	applies map[string]int
}

func startAgents(ctx context.Context, env *testenv.Env, o options) (*agents, error) {
	c, err := fastClient(env)
	if err != nil {
		return nil, err
	}
	ca, err := cache.New(fastConfig(env), cache.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	inf, err := ca.GetInformer(ctx, &v1.GPUNode{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &agents{
		c: c, cancel: cancel, o: o,
		latest: map[string]*v1.GPUNode{}, queued: map[string]bool{},
		queue: make(chan string, 4*o.nodes+16), atTarget: map[string]bool{}, atAck: map[string]bool{},
		disrupted: map[string]bool{}, applies: map[string]int{},
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.observe(obj) },
		UpdateFunc: func(_, obj any) { a.observe(obj) },
	})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		cancel()
		return nil, fmt.Errorf("the agents' GPUNode informer did not sync")
	}
	for range o.agentWorkers {
		go a.work(ctx)
	}
	return a, nil
}

func (a *agents) stop() { a.cancel() }

func (a *agents) observe(obj any) {
	gn, ok := obj.(*v1.GPUNode)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.latest[gn.Name] = gn
	a.noteTarget(gn)
	a.noteAck(gn)
	a.noteDisrupted(gn)
	if !a.queued[gn.Name] && agentsim.Apply(gn.DeepCopy(), nil) {
		a.queued[gn.Name] = true
		a.queue <- gn.Name
	}
}

// work acks queued nodes: it applies the latest spec it has seen to the latest status and writes it. A
// conflict means a newer version is on its way through the informer, which queues the node again.
func (a *agents) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-a.queue:
			a.mu.Lock()
			gn := a.latest[name].DeepCopy()
			delete(a.queued, name)
			a.mu.Unlock()
			before := gn.Status.DeepCopy()
			if !agentsim.Apply(gn, nil) {
				continue
			}
			err := a.c.Status().Update(ctx, gn)
			if err == nil {
				a.countApplies(gn, before)
			}
			if err != nil && !apierrors.IsConflict(err) && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
				a.mu.Lock()
				if !a.queued[name] {
					a.queued[name] = true
					a.queue <- name
				}
				a.mu.Unlock()
			}
		}
	}
}

// setTarget starts waiting for every spec to carry policy generation gen with sharing hash; the returned
// channel closes when they all do.
func (a *agents) setTarget(gen int64, hash string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.targetGen, a.targetHash = gen, hash
	a.atTarget = map[string]bool{}
	a.reached = make(chan struct{})
	for _, gn := range a.latest {
		a.noteTarget(gn)
	}
	return a.reached
}

func (a *agents) noteTarget(gn *v1.GPUNode) {
	if a.reached == nil || a.targetHash == "" {
		return
	}
	ok := len(gn.Spec.GPUs) == a.o.gpus
	for _, e := range gn.Spec.GPUs {
		ok = ok && e.PolicyGeneration == a.targetGen && v1.SharingHash(e.Sharing) == a.targetHash
	}
	if ok {
		a.atTarget[gn.Name] = true
	} else {
		delete(a.atTarget, gn.Name)
	}
	if len(a.atTarget) == a.o.nodes {
		close(a.reached)
		a.targetHash = ""
	}
}

// setAckTarget starts waiting for every GPU's status to report sharing hash applied from policy
// generation gen; the returned channel closes when every node's does.
func (a *agents) setAckTarget(gen int64, hash string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ackGen, a.ackHash, a.watchAck = gen, hash, true
	a.atAck = map[string]bool{}
	a.acked = make(chan struct{})
	for _, gn := range a.latest {
		a.noteAck(gn)
	}
	return a.acked
}

func (a *agents) noteAck(gn *v1.GPUNode) {
	if !a.watchAck {
		return
	}
	ok := len(gn.Status.GPUs) == a.o.gpus && len(gn.Spec.GPUs) == a.o.gpus
	for i := range gn.Spec.GPUs {
		e := &gn.Spec.GPUs[i]
		g := resolve.FindGPU(gn.Status.GPUs, e.UUID)
		ok = ok && e.PolicyGeneration == a.ackGen && resolve.Acked(e, g) && g.Applied.SpecHash == a.ackHash
	}
	if ok {
		a.atAck[gn.Name] = true
	} else {
		delete(a.atAck, gn.Name)
	}
	if len(a.atAck) == a.o.nodes {
		close(a.acked)
		a.watchAck = false
	}
}

// noteDisrupted keeps the set of nodes with a spec entry their agent has not acked.
func (a *agents) noteDisrupted(gn *v1.GPUNode) {
	pending := false
	for i := range gn.Spec.GPUs {
		if !resolve.Acked(&gn.Spec.GPUs[i], resolve.FindGPU(gn.Status.GPUs, gn.Spec.GPUs[i].UUID)) {
			pending = true
		}
	}
	if pending {
		a.disrupted[gn.Name] = true
	} else {
		delete(a.disrupted, gn.Name)
	}
	a.maxDisrupted = max(a.maxDisrupted, len(a.disrupted))
}

func (a *agents) countApplies(gn *v1.GPUNode, before *v1.GPUNodeStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range gn.Status.GPUs {
		g := &gn.Status.GPUs[i]
		old := resolve.FindGPU(before.GPUs, g.UUID)
		if g.Applied != nil && (old == nil || old.Applied == nil || old.Applied.SpecHash != g.Applied.SpecHash) {
			a.applies[gn.Name+"/"+g.UUID]++
		}
	}
}

// resetCounts starts a new window for maxDisrupted and applies.
func (a *agents) resetCounts() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.maxDisrupted = len(a.disrupted)
	a.applies = map[string]int{}
}

// counts reports the window: the most nodes disrupted at once, how many GPUs were configured, and how
// many of them more than once.
func (a *agents) counts() (maxDisrupted, gpus, twice int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.applies {
		if n > 1 {
			twice++
		}
	}
	return a.maxDisrupted, len(a.applies), twice
}
