package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/resolve"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// Leader election as the bench runs it: controller-runtime's defaults (the manager's own defaults are
// longer, to ride out an API server outage; docs/controller.md), so the takeover it measures stays short.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
	// takeoverBound is the latest a follower can lead after the leader dies: the lease must run out from
	// the last renewal the follower saw, and client-go's candidates poll every retry period stretched by
	// up to 2.2x (JitterFactor 1.2), once to see that last renewal and once to find the lease expired.
	takeoverBound = leaseDuration + 2*retryPeriod*22/10
)

type failoverResult struct {
	killedAt       int // nodes acked when the leader was killed
	takeover       time.Duration
	ready          time.Duration
	limit          int
	maxDisrupted   int
	gpus, twice    int
	maxUnavailable string
}

// runFailover runs two manager replicas with leader election, rolls a disruptive change out within
// o.failoverMaxUnavailable, SIGKILLs the leader once a third of the nodes acked, and reports how long the
// other replica took to lead, whether the rollout finished, the most nodes disrupted at once and the
// GPUs configured more than once.
func runFailover(ctx context.Context, env *testenv.Env, a *agents, mb *managerBuild, o options) (failoverResult, error) {
	r := failoverResult{maxUnavailable: o.failoverMaxUnavailable}
	elect := []string{"--leader-elect", "--leader-election-namespace", "default",
		"--leader-election-lease-duration", leaseDuration.String(), "--leader-election-renew-deadline", renewDeadline.String(),
		"--leader-election-retry-period", retryPeriod.String()}
	first, err := mb.start(o, "replica-a", elect...)
	if err != nil {
		return r, err
	}
	defer first.stop()
	if err := waitLeader(first, time.Minute); err != nil {
		return r, err
	}
	second, err := mb.start(o, "replica-b", elect...)
	if err != nil {
		return r, err
	}
	defer second.stop()
	// The follower's cache syncs before it leads (caches run on every replica); give it the time to.
	time.Sleep(3 * time.Second)

	mu := intstr.Parse(o.failoverMaxUnavailable)
	r.limit = resolve.MaxUnavailable(v1.Rollout{MaxUnavailable: &mu}, o.nodes)
	// Not a sharing any step or floor writes, so every ack the floor waits for is a real status write.
	want := b.MPS(4, 30)
	patch, err := json.Marshal([]map[string]any{
		{"op": "replace", "path": "/spec/sharing", "value": want},
		{"op": "add", "path": "/spec/rollout", "value": map[string]any{"maxUnavailable": mu}},
	})
	if err != nil {
		return r, err
	}
	a.resetCounts()
	start := time.Now()
	p := &v1.GPUSharingPolicy{}
	p.Name = policyName
	if err := env.Client.Patch(ctx, p, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return r, err
	}
	acked := a.setAckTarget(p.Generation, v1.SharingHash(want))
	for a.ackedNodes() < o.nodes/3 {
		if time.Since(start) > o.timeout {
			return r, fmt.Errorf("failover: a third of the nodes did not ack within %s", o.timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.killedAt = a.ackedNodes()
	first.kill()
	killed := time.Now()
	if err := waitLeader(second, 2*takeoverBound); err != nil {
		return r, err
	}
	r.takeover = time.Since(killed)
	select {
	case <-acked:
	case <-time.After(o.timeout):
		return r, fmt.Errorf("failover: the rollout did not finish within %s", o.timeout)
	}
	if err := waitReady(ctx, env, o, p.Generation, o.timeout); err != nil {
		return r, err
	}
	r.ready = time.Since(start)
	r.maxDisrupted, r.gpus, r.twice = a.counts()
	return r, nil
}

func waitLeader(m *manager, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ok, err := isLeader(m.metrics); err == nil && ok {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("manager pid %d did not become leader within %s", m.pid(), timeout)
}

func (r failoverResult) ok() bool {
	return r.takeover <= takeoverBound && r.maxDisrupted <= r.limit && r.twice == 0 && r.gpus > 0
}

func (r failoverResult) print(o options) {
	verdict := "PASS"
	if !r.ok() {
		verdict = "FAIL"
	}
	fmt.Printf("\nfailover: %d nodes, maxUnavailable %s (%d nodes); leader SIGKILLed with %d nodes acked; the other replica led %.1fs later (lease %s, retry %s, bound %s); policy Ready %.1fs after the change; at most %d nodes disrupted at once (limit %d); %d GPUs configured, %d more than once: %s\n",
		o.nodes, r.maxUnavailable, r.limit, r.killedAt, r.takeover.Seconds(), leaseDuration, retryPeriod, takeoverBound, r.ready.Seconds(), r.maxDisrupted, r.limit, r.gpus, r.twice, verdict)
}

func (a *agents) ackedNodes() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.atAck)
}
