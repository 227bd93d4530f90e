package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// waitReady polls until every named policy is Ready for its current generation, printing each change of
// the fleet's state. It returns false when ctx ends first.
func (c *cluster) waitReady(ctx context.Context, names []string, errs <-chan error) (bool, error) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		line, ready, err := c.readiness(ctx, names)
		if err != nil && ctx.Err() == nil {
			return false, err
		}
		if line != last && line != "" {
			say("%s", line)
			last = line
		}
		if ready {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, nil
		case err := <-errs:
			return false, err
		case <-tick.C:
		}
	}
}

// readiness summarizes the policies: "3/5 policies Ready (waiting: mixed-mig Applying, ...)".
func (c *cluster) readiness(ctx context.Context, names []string) (string, bool, error) {
	var waiting []string
	for _, name := range names {
		p := &v1alpha1.GPUSharingPolicy{}
		if err := c.env.Client.Get(ctx, types.NamespacedName{Name: name}, p); err != nil {
			return "", false, err
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case cond == nil || p.Status.ObservedGeneration != p.Generation:
			waiting = append(waiting, name+" (not yet reconciled)")
		case cond.Status != "True":
			waiting = append(waiting, fmt.Sprintf("%s %s: %d/%d GPUs ready", name, cond.Reason, p.Status.ReadyGPUs, p.Status.MatchedGPUs))
		}
	}
	line := fmt.Sprintf("%d/%d policies Ready", len(names)-len(waiting), len(names))
	if len(waiting) > 0 {
		line += " (waiting: " + strings.Join(waiting, "; ") + ")"
	}
	return line, len(waiting) == 0, nil
}
