package gate

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WithWriteTiming returns c with its object writes (create, update, patch, delete) timed into the gate.
// Reads come from the cache and say nothing about the API server. Subresource writes (status) are not
// timed: the resolver, the gated controller, writes none.
func WithWriteTiming(c client.Client, g *Gate) client.Client { return &timedClient{Client: c, g: g} }

type timedClient struct {
	client.Client
	g *Gate
}

// timed runs one write and feeds its latency to the gate. A refused write (conflict, invalid, gone) was
// still answered by the server, so its time counts too.
func (c *timedClient) timed(write func() error) error {
	start := time.Now()
	err := write()
	c.g.Observe(time.Since(start))
	return err
}

func (c *timedClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.timed(func() error { return c.Client.Create(ctx, obj, opts...) })
}

func (c *timedClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.timed(func() error { return c.Client.Update(ctx, obj, opts...) })
}

func (c *timedClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.timed(func() error { return c.Client.Patch(ctx, obj, patch, opts...) })
}

func (c *timedClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.timed(func() error { return c.Client.Delete(ctx, obj, opts...) })
}
