package main

import (
	"context"
	"fmt"

	"github.com/gpusharing/gpusharing/test/simnode"
)

// simNodes cover every sample: two inference nodes (MPS, with MIG on GPUs 0-1 by the higher-priority
// mixed-mig policy, rolled out one node at a time), and one node each for notebooks (time-slicing),
// training (exclusive), batch (time-slicing with oversubscription), serving (production beside
// opportunistic work, sharing.qos) and dynamic (MIG from demand). Where the pods of the demo and of
// examples/pods land (notebooks, training, serving, dynamic) the agent also serves the DRA kubelet
// plugin, and a stand-in kubelet (simnode.Kubelet) prepares the claims of the pods bound to the node
// and finishes their deletion, so a deleted workload's space comes back. On the notebook node it also
// simulates what the pods' containers use (their env declares it), which the agent's accounting reads:
// the right-sizing part's samples.
var simNodes = []simnode.Node{
	{Name: "dgx-h100-a", Model: "H100", GPUs: 8, Labels: map[string]string{"pool": "inference"}, Seq: 1},
	{Name: "dgx-h100-b", Model: "H100", GPUs: 8, Labels: map[string]string{"pool": "inference"}, Seq: 2},
	{Name: "dgx-a100-c", Model: "A100", GPUs: 8, Labels: map[string]string{"pool": "notebooks"}, Seq: 3, DRAPlugin: true, PodUsage: true},
	{Name: "dgx-a100-d", Model: "A100", GPUs: 4, Labels: map[string]string{"pool": "training"}, Seq: 4, DRAPlugin: true},
	{Name: "dgx-h100-e", Model: "H100", GPUs: 4, Labels: map[string]string{"pool": "batch"}, Seq: 5},
	{Name: "dgx-h100-g", Model: "H100", GPUs: 2, Labels: map[string]string{"pool": "serving"}, Seq: 7, DRAPlugin: true},
	{Name: dynamicNode, Model: "H100", GPUs: 1, Labels: map[string]string{"pool": "dynamic"}, Seq: 6, DRAPlugin: true},
}

// runNode registers the Node and starts the real agent for it over a mock DGX.
func (c *cluster) runNode(ctx context.Context, n simnode.Node, errs chan<- error) error {
	if err := simnode.CreateNode(ctx, c.env.Client, n); err != nil {
		return fmt.Errorf("creating node %s: %w", n.Name, err)
	}
	return simnode.Start(ctx, c.env.Config, c.env.Scheme, n, c.dir, errs)
}
