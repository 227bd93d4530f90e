package main

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

const poolLabel, poolValue = "gpusharing.io/bench-pool", "bench"

func nodeName(i int) string { return fmt.Sprintf("gpu-node-%05d", i) }

// fastClient is a client for the benchmark's own traffic (node creation, agents), with a rate limit
// high enough that the benchmark never waits on itself.
func fastClient(env *testenv.Env) (client.Client, error) {
	return client.New(fastConfig(env), client.Options{Scheme: env.Scheme})
}

func fastConfig(env *testenv.Env) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 5000, 10000
	return cfg
}

// createNodes creates every Node and GPUNode and publishes the GPUNodes' inventory, each GPU reported
// Exclusive as found, the way agents do when they start.
func createNodes(ctx context.Context, env *testenv.Env, o options) error {
	c, err := fastClient(env)
	if err != nil {
		return err
	}
	work := make(chan int)
	errs := make(chan error, o.nodes)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				errs <- createNode(ctx, c, nodeName(i), o.gpus)
			}
		}()
	}
	for i := range o.nodes {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func createNode(ctx context.Context, c client.Client, name string, gpus int) error {
	if err := c.Create(ctx, b.Node(name, poolLabel, poolValue, "node.kubernetes.io/instance-type", "p5.48xlarge")); err != nil {
		return fmt.Errorf("creating Node %s: %w", name, err)
	}
	gn := b.GPUNode(name)
	if err := c.Create(ctx, gn); err != nil {
		return fmt.Errorf("creating GPUNode %s: %w", name, err)
	}
	inv := make([]v1.GPUStatus, gpus)
	for i := range inv {
		inv[i] = b.GPU(name, int32(i), b.WithApplied(b.Exclusive(), ""))
	}
	gn.Status.GPUs, gn.Status.GPUCount = inv, int32(gpus)
	// An agent that has published its inventory has observed its GPUNode's generation; without it every
	// simulated agent would write an ack of generation 1 into the first timed phase.
	gn.Status.ObservedGeneration = gn.Generation
	if err := c.Status().Update(ctx, gn); err != nil {
		return fmt.Errorf("publishing GPUNode %s inventory: %w", name, err)
	}
	return nil
}
