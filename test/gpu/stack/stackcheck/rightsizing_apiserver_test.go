package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// The rightsizing scenario's objects, against the real kube-apiserver: the ReplicaSet, its pods and their
// claims made as from a template are accepted, and the manager's recommender, reading the claims in a
// GPUNode's status as the agent publishes them, folds the three pods into the one recommendation the
// scenario waits for (rsRecName), at the size of the worked example.
func TestTheRightsizingScenarioPodsMakeTheRecommendationItWaitsFor(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	c := env.Client
	rs, err := createReplicaSet(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	gn := b.GPUNode(nodeName)
	if err := c.Create(ctx, gn); err != nil {
		t.Fatal(err)
	}
	g := b.GPU(nodeName, 0)
	g.Applied = &v1alpha1.AppliedSharing{Strategy: v1alpha1.StrategyExclusive, SpecHash: "x",
		Sizing: &v1alpha1.Sizing{Mode: v1alpha1.SizingPerClaim, MemoryStep: ptr.To(resource.MustParse("256Mi"))}}
	g.Sized = &v1alpha1.GPUSizedClaims{}
	for i := range 3 {
		pod, claim, err := createRSPod(ctx, c, rs, fmt.Sprintf("%05d", i), resource.MustParse(rsClaim))
		if err != nil {
			t.Fatal(err)
		}
		g.Sized.Claims = append(g.Sized.Claims, v1alpha1.SizedClaimStatus{Namespace: claim.Namespace, Name: claim.Name, Pods: []string{pod.Name},
			Memory: ptr.To(resource.MustParse(rsClaim)), MemoryUsed: ptr.To(resource.MustParse("3Gi"))})
	}
	gn.Status.GPUs, gn.Status.GPUCount = []v1alpha1.GPUStatus{g}, 1
	if err := c.Status().Update(ctx, gn); err != nil {
		t.Fatal(err)
	}

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	o := rightsizing.DefaultOptions()
	o.SampleInterval, o.FlushInterval, o.CheckpointInterval, o.Config.MinHistory = rsSampleInterval, rsWriteInterval, rsWriteInterval, 0
	if err := (&rightsizing.Rightsizer{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Options: o}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-done })

	wait.For(t, 30*time.Second, func() error {
		var rec v1alpha1.GPUShareRecommendation
		if err := c.Get(ctx, client.ObjectKey{Namespace: podNamespace, Name: rsRecName}, &rec); err != nil {
			return err
		}
		// 3Gi's bucket ends at 3174.8Mi; plus 10 %: 3492.3Mi, which the 256Mi step rounds to 3584Mi.
		if rec.Status.Samples != 3 || rec.Status.InitialMemory == nil || rec.Status.InitialMemory.String() != "3584Mi" {
			return fmt.Errorf("status %+v", rec.Status)
		}
		return nil
	}, "the scenario's recommendation from its three pods")
}
