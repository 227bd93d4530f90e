package rightsizing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// startRightsizer runs a manager with only the rightsizer, sampling and writing every few tens of
// milliseconds; the returned function stops it as a manager restart would.
func startRightsizer(t *testing.T) func() {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	o := rightsizing.DefaultOptions()
	o.SampleInterval, o.FlushInterval, o.CheckpointInterval = 50*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	o.Config.MinHistory = 0
	r := &rightsizing.Rightsizer{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Options: o}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// share is one sized claim as an agent reports it in GPUNode status.
type share struct {
	claim, pod   string
	memory, used string
	sm           int32
	// refused counts allocations the shim refused at the claim's size, which would have brought it to demand.
	refused int64
	demand  string
}

// publish writes the node's GPU 0 as an agent does: sized per claim with a 512Mi step, each share
// listed among the sized claims and its pod among the consumers.
func publish(t *testing.T, node, ns string, shares ...share) {
	t.Helper()
	ctx := context.Background()
	gn := &v1.GPUNode{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, gn); err != nil {
		gn = b.GPUNode(node)
		create(t, gn)
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), b.GPUNode(node)) })
	}
	g := b.GPU(node, 0)
	g.Applied = &v1.AppliedSharing{Strategy: v1.StrategyMPS, SpecHash: "x",
		Sizing: &v1.Sizing{Mode: v1.SizingPerClaim, MemoryStep: ptr.To(resource.MustParse("512Mi"))}}
	g.Sized = &v1.GPUSizedClaims{}
	g.Usage = &v1.GPUUsage{}
	for _, s := range shares {
		sc := v1.SizedClaimStatus{Namespace: ns, Name: s.claim, Pods: []string{s.pod},
			Memory: ptr.To(resource.MustParse(s.memory)), MemoryUsed: ptr.To(resource.MustParse(s.used)), AllocationsRefused: s.refused}
		if s.demand != "" {
			sc.RefusedDemand = ptr.To(resource.MustParse(s.demand))
		}
		g.Sized.Claims = append(g.Sized.Claims, sc)
		g.Usage.Consumers = append(g.Usage.Consumers, v1.GPUConsumer{Namespace: ns, Pod: s.pod, Container: "c",
			Memory: ptr.To(resource.MustParse(s.used)), SMUtilization: ptr.To(s.sm)})
	}
	gn.Status.GPUs, gn.Status.GPUCount = []v1.GPUStatus{g}, 1
	if err := env.Client.Status().Update(ctx, gn); err != nil {
		t.Fatalf("publishing GPUNode %s: %v", node, err)
	}
}

// webPods creates n pods of Deployment web's ReplicaSet rs, each with an allocated 10Gi claim, and the
// shares they hold (used each).
func webPods(t *testing.T, ns string, rs metav1.Object, from, n int, used string) []share {
	t.Helper()
	var out []share
	for i := from; i < from+n; i++ {
		p := pod(t, ns, fmt.Sprintf("%s-p%04d", rs.GetName(), i), ctrlRef("apps/v1", "ReplicaSet", rs))
		c := claimFor(p, "gpu", "c0000", "10Gi")
		create(t, c)
		allocate(t, c)
		out = append(out, share{claim: c.Name, pod: p.Name, memory: "10Gi", used: used, sm: 30})
	}
	return out
}

func getRec(ns, name string) (*v1.GPUShareRecommendation, error) {
	var r v1.GPUShareRecommendation
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &r)
	return &r, err
}

func q(s *resource.Quantity) string {
	if s == nil {
		return "<none>"
	}
	return s.String()
}

func TestRecommendsFromPodPeaksKeepsHistoryAndBumpsOnEviction(t *testing.T) {
	ns := namespace(t, "a", nil, nil)
	node := ns + "-node"
	rs := deployment(t, ns, "web", "7d9f8c6b5", nil)
	shares := webPods(t, ns, rs, 0, 3, "3Gi")
	publish(t, node, ns, shares...)
	stop := startRightsizer(t)

	// Pods of 10Gi claims peaking at 3Gi: 3Gi's bucket ends at 3174.8Mi, plus 10 % is 3492.3Mi, which
	// the 512Mi step rounds to 3.5Gi (internal/recommend's worked example). Each claim would free 6.5Gi.
	wait.For(t, 30*time.Second, func() error {
		r, err := getRec(ns, "deployment-web-gpu")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(r.Status.Conditions, v1.ConditionRecommended)
		if c == nil || c.Status != metav1.ConditionTrue || q(r.Status.InitialMemory) != "3584Mi" || r.Status.Samples != 3 ||
			q(r.Status.ClaimMemory) != "10Gi" || q(r.Status.MemoryFreed) != "6656Mi" || r.Status.Mode != v1.RightsizingOff {
			return fmt.Errorf("status %+v", r.Status)
		}
		if r.Status.Compute == nil || r.Status.Compute.Target != 35 {
			return fmt.Errorf("compute %+v, want target 35", r.Status.Compute)
		}
		if len(r.OwnerReferences) != 1 || r.OwnerReferences[0].Kind != "Deployment" || r.OwnerReferences[0].Name != "web" {
			return fmt.Errorf("owners %+v, want the Deployment web", r.OwnerReferences)
		}
		return nil
	}, "a recommendation of 3.5Gi from three pod peaks of 3Gi")
	// The metrics: 3.5Gi recommended against 10Gi requested, and the three claims would free 6.5Gi each.
	labels := map[string]string{"namespace": ns, "recommendation": "deployment-web-gpu", "kind": "Deployment", "workload": "web"}
	wait.For(t, 30*time.Second, func() error {
		rec, _ := prom.Find(t, metrics.Registry, "gpusharing_rightsizing_recommended_memory_bytes", labels)
		req, _ := prom.Find(t, metrics.Registry, "gpusharing_rightsizing_requested_memory_bytes", labels)
		free, _ := prom.Find(t, metrics.Registry, "gpusharing_rightsizing_freeable_memory_bytes", nil)
		if rec != 3584<<20 || req != 10<<30 || free != 3*6656<<20 {
			return fmt.Errorf("recommended %v, requested %v, freeable %v", rec, req, free)
		}
		return nil
	}, "the metrics of the recommendation")

	// A restart: the new manager knows nothing but the object. The old pods are gone and one new pod
	// holds 1Gi; were the history lost, one sample would be too few to recommend anything.
	stop()
	fresh := webPods(t, ns, rs, 3, 1, "1Gi")
	publish(t, node, ns, fresh...)
	startRightsizer(t)
	wait.For(t, 30*time.Second, func() error {
		r, err := getRec(ns, "deployment-web-gpu")
		if err != nil {
			return err
		}
		if r.Status.Samples != 4 || q(r.Status.InitialMemory) != "3584Mi" {
			return fmt.Errorf("samples %d, initial %s; want 4 and 3584Mi", r.Status.Samples, q(r.Status.InitialMemory))
		}
		return nil
	}, "the restarted manager goes on from the checkpointed history")

	// The new pod goes over its 10Gi claim (the agent reports or evicts it): the sample stands at
	// max(10Gi*1.2, 10Gi+256Mi) = 12Gi, so the target rises past 12Gi.
	fresh[0].used = "10752Mi"
	publish(t, node, ns, fresh...)
	wait.For(t, 30*time.Second, func() error {
		r, err := getRec(ns, "deployment-web-gpu")
		if err != nil {
			return err
		}
		if r.Status.InitialMemory == nil || r.Status.InitialMemory.Cmp(resource.MustParse("12Gi")) <= 0 {
			return fmt.Errorf("initial %s, want above 12Gi", q(r.Status.InitialMemory))
		}
		return nil
	}, "a pod over its claim raises the target")
}

func TestModeFollowsNamespaceAndWorkloadOptIn(t *testing.T) {
	ns := namespace(t, "a", map[string]string{v1.RightsizingModeKey: "Initial"},
		map[string]string{v1.RightsizingMinMemoryKey: "4Gi"})
	node := ns + "-node"
	web := deployment(t, ns, "web", "7d9f8c6b5", nil)
	// batch opts out with its own annotation.
	batch := deployment(t, ns, "batch", "6c8d9f7b4", map[string]string{v1.RightsizingModeKey: "Off"})
	shares := append(webPods(t, ns, web, 0, 3, "3Gi"), webPods(t, ns, batch, 0, 3, "3Gi")...)
	publish(t, node, ns, shares...)
	startRightsizer(t)
	for _, tt := range []struct {
		name    string
		mode    v1.RightsizingMode
		initial string
	}{
		// The namespace's lower bound lifts 3.5Gi to 4Gi.
		{"deployment-web-gpu", v1.RightsizingInitial, "4Gi"},
		{"deployment-batch-gpu", v1.RightsizingOff, "4Gi"},
	} {
		wait.For(t, 30*time.Second, func() error {
			r, err := getRec(ns, tt.name)
			if err != nil {
				return err
			}
			if r.Status.Mode != tt.mode || q(r.Status.InitialMemory) != tt.initial {
				return fmt.Errorf("mode %q initial %s", r.Status.Mode, q(r.Status.InitialMemory))
			}
			return nil
		}, "%s in mode %s with %s", tt.name, tt.mode, tt.initial)
	}
}

func TestEachPodIsFoldedIntoItsTopOwner(t *testing.T) {
	ns := namespace(t, "a", nil, nil)
	node := ns + "-node"
	labels := map[string]string{"app": "x"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	always := *tmpl.DeepCopy()
	always.Spec.RestartPolicy = corev1.RestartPolicyAlways
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
		Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: always}}
	create(t, sts)
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nightly"},
		Spec: batchv1.CronJobSpec{Schedule: "0 1 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl}}}}
	create(t, cj)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nightly-29412345", OwnerReferences: ctrlRef("batch/v1", "CronJob", cj)},
		Spec: batchv1.JobSpec{Template: tmpl}}
	job.Spec.Template.Labels = map[string]string{"batch.kubernetes.io/controller-uid": "x"}
	job.Spec.ManualSelector = ptr.To(true)
	job.Spec.Selector = &metav1.LabelSelector{MatchLabels: job.Spec.Template.Labels}
	create(t, job)

	var shares []share
	for i, p := range []*corev1.Pod{
		pod(t, ns, "db-0", ctrlRef("apps/v1", "StatefulSet", sts)),
		pod(t, ns, "nightly-29412345-q2w3e", ctrlRef("batch/v1", "Job", job)),
		pod(t, ns, "solo", nil),
	} {
		c := claimFor(p, "gpu", fmt.Sprintf("c%04d", i), "10Gi")
		create(t, c)
		allocate(t, c)
		shares = append(shares, share{claim: c.Name, pod: p.Name, memory: "10Gi", used: "1Gi", sm: 10})
	}
	publish(t, node, ns, shares...)
	startRightsizer(t)
	for name, want := range map[string]v1.WorkloadRef{
		"statefulset-db-gpu":  {Kind: v1.WorkloadStatefulSet, Name: "db"},
		"cronjob-nightly-gpu": {Kind: v1.WorkloadCronJob, Name: "nightly"},
		"pod-solo-gpu":        {Kind: v1.WorkloadPod, Name: "solo"},
	} {
		wait.For(t, 30*time.Second, func() error {
			r, err := getRec(ns, name)
			if err != nil {
				return err
			}
			if r.Spec.Workload != want || r.Status.Samples != 1 {
				return fmt.Errorf("workload %+v samples %d", r.Spec.Workload, r.Status.Samples)
			}
			return nil
		}, "%s for %s %s", name, want.Kind, want.Name)
	}
}
