// Command rightsizing measures what the right-sizing recommender costs at fleet scale against a real
// kube-apiserver and etcd (test/testenv): N GPUNodes with G GPUs sized per claim and P claims per GPU,
// each claim made from a template for a pod of a Deployment (R replicas each), as the kube-controller-
// manager makes them. Simulated agents move each claim's memory in GPUNode status as the real agent
// publishes it; the recommender runs in this process on a fake clock, so 10 minutes of its sample and
// write passes take seconds, and the bench prints the manager's heap for it, the CPU of a sample pass and
// the API writes per minute.
//
//	go run ./test/bench/rightsizing -nodes 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/controllers/rightsizing"
	b "github.com/gpusharing/gpusharing/controllers/testutil/builders"
	"github.com/gpusharing/gpusharing/test/testenv"
)

type options struct {
	nodes, gpus, perGPU, replicas, namespaces, workers int
	minutes                                            int
	moved, qps                                         float64
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 1000, "GPUNodes.")
	flag.IntVar(&o.gpus, "gpus", 8, "GPUs per node, each sized per claim.")
	flag.IntVar(&o.perGPU, "per-gpu", 4, "Claims (pods) per GPU.")
	flag.IntVar(&o.replicas, "replicas", 8, "Pods per Deployment: workloads = nodes*gpus*per-gpu/replicas.")
	flag.IntVar(&o.namespaces, "namespaces", 50, "Namespaces the Deployments spread over.")
	flag.IntVar(&o.workers, "workers", 32, "Goroutines creating the objects.")
	flag.IntVar(&o.minutes, "minutes", 20, "Simulated minutes of recommender passes after the first.")
	flag.Float64Var(&o.moved, "moved", 0.2, "Share of the claims whose memory the agents move each minute.")
	flag.Float64Var(&o.qps, "qps", 50, "The recommender's client rate, requests per second (the manager's --kube-api-qps; burst twice that).")
	flag.Parse()
	ctrl.SetLogger(logr.Discard())
	fmt.Printf("command: go run ./test/bench/rightsizing -nodes %d -gpus %d -per-gpu %d -replicas %d -minutes %d -moved %g -qps %g\n",
		o.nodes, o.gpus, o.perGPU, o.replicas, o.minutes, o.moved, o.qps)
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// counting counts the writes the recommender makes.
type counting struct {
	client.Client
	writes *atomic.Int64
}

func (c counting) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.writes.Add(1)
	return c.Client.Create(ctx, obj, opts...)
}

func (c counting) Status() client.SubResourceWriter {
	return countingStatus{c.Client.Status(), c.writes}
}

type countingStatus struct {
	client.SubResourceWriter
	writes *atomic.Int64
}

func (c countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	c.writes.Add(1)
	return c.SubResourceWriter.Update(ctx, obj, opts...)
}

// countingReader counts the reads the recommender makes uncached.
type countingReader struct {
	client.Reader
	reads *atomic.Int64
}

func (c countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

type claimRef struct{ ns, name, pod string }

func run(o options) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	ctx := context.Background()
	c := env.Client

	start := time.Now()
	claims, err := createWorkloads(ctx, c, o)
	if err != nil {
		return err
	}
	fmt.Printf("created %d Deployments, %d pods and claims in %d namespaces in %s\n",
		len(claims)/o.replicas, len(claims), o.namespaces, time.Since(start).Round(time.Second))

	rng := rand.New(rand.NewPCG(1, 2))
	used := make([]int64, len(claims))
	for i := range used {
		used[i] = (2560 + rng.Int64N(512)) << 20
	}
	if err := publishAll(ctx, c, o, claims, used); err != nil {
		return err
	}

	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	var writes atomic.Int64
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)

	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = float32(o.qps), int(2*o.qps)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		return err
	}
	ro := rightsizing.DefaultOptions()
	ro.Clock = clk
	// The tickers never fire: the bench drives the passes on the fake clock at the default intervals.
	sampleEvery, flushEvery := ro.SampleInterval, ro.FlushInterval
	ro.SampleInterval, ro.FlushInterval = 24*time.Hour, 24*time.Hour
	var reads atomic.Int64
	r := &rightsizing.Rightsizer{Client: counting{mgr.GetClient(), &writes}, APIReader: countingReader{mgr.GetAPIReader(), &reads}, Options: ro}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = mgr.Start(mctx) }()
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		return fmt.Errorf("cache did not sync")
	}

	// After a start every claim is read once, at most MaxNewClaimsPerPass a pass: the passes run back to
	// back here, so their wall time is what reading the fleet costs at the client's rate.
	t0 := time.Now()
	cpu0 := cpuTime()
	passes := 0
	for {
		before := reads.Load()
		if err := r.SampleOnce(ctx); err != nil {
			return fmt.Errorf("start-up sample: %w", err)
		}
		passes++
		if reads.Load() == before {
			break
		}
	}
	fmt.Printf("start-up: %d passes of at most %d new claims read every claim, pod and ReplicaSet once: %d reads in %s wall (%s CPU) at %g requests/s\n",
		passes, ro.MaxNewClaimsPerPass, reads.Load(), time.Since(t0).Round(time.Second), (cpuTime() - cpu0).Round(time.Millisecond), o.qps)

	startReads := reads.Load()
	var sampleCPU time.Duration
	samples := 0
	var steadyWrites int64
	perMinute := int(flushEvery / sampleEvery)
	for minute := 0; minute <= o.minutes; minute++ {
		if minute > 0 {
			// The agents move some claims' memory; they publish only moves past their threshold, which
			// any move here is.
			for i := range used {
				if rng.Float64() < o.moved {
					used[i] = (2560 + rng.Int64N(512)) << 20
				}
			}
			if err := publishAll(ctx, c, o, claims, used); err != nil {
				return err
			}
			time.Sleep(2 * time.Second) // the cache takes the agents' writes in before the pass is timed
		}
		for s := 0; s < perMinute; s++ {
			clk.Step(sampleEvery)
			cpu := cpuTime()
			if err := r.SampleOnce(ctx); err != nil {
				return err
			}
			if minute > 0 {
				sampleCPU += cpuTime() - cpu
				samples++
			}
		}
		before := writes.Load()
		if err := r.FlushOnce(ctx); err != nil {
			return fmt.Errorf("write pass: %w", err)
		}
		if minute == 0 {
			fmt.Printf("first write pass: %d writes (a create and a status write per workload)\n", writes.Load()-before)
		} else {
			steadyWrites += writes.Load() - before
		}
	}
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	var recs v1.GPUShareRecommendationList
	if err := c.List(ctx, &recs); err != nil {
		return err
	}
	recommended := 0
	for _, rec := range recs.Items {
		if rec.Status.InitialMemory != nil {
			recommended++
		}
	}
	perPass := time.Duration(0)
	if samples > 0 {
		perPass = sampleCPU / time.Duration(samples)
	}
	fmt.Printf("fleet: %d nodes x %d GPUs x %d claims = %d claims, %d workloads (%d recommended)\n",
		o.nodes, o.gpus, o.perGPU, len(claims), len(recs.Items), recommended)
	fmt.Printf("heap of the recommender's manager (its caches: GPUNodes, recommendations, namespaces, Deployment metadata; and its histories): %.0f MiB\n",
		float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/(1<<20))
	fmt.Printf("sample pass CPU: %s per pass, every %s: %.1f%% of a core\n", perPass.Round(time.Millisecond), sampleEvery,
		100*perPass.Seconds()/sampleEvery.Seconds())
	fmt.Printf("API reads after start-up: %d (new claims only)\n", reads.Load()-startReads)
	fmt.Printf("API writes: %.1f per minute over %d simulated minutes (%d moved %.0f%% of claims a minute)\n",
		float64(steadyWrites)/float64(o.minutes), o.minutes, o.minutes, 100*o.moved)
	return nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parallel runs f(i) for i in [0, n) on workers goroutines and returns the first error.
func parallel(workers, n int, f func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

func ctrlRef(apiVersion, kind string, obj metav1.Object) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: obj.GetName(), UID: obj.GetUID(), Controller: ptr.To(true)}}
}

// createWorkloads creates the namespaces, the Deployments with one ReplicaSet each, their pods and one
// claim per pod, and returns the claims in creation order.
func createWorkloads(ctx context.Context, c client.Client, o options) ([]claimRef, error) {
	for i := range o.namespaces {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%03d", i)}}); err != nil {
			return nil, err
		}
	}
	total := o.nodes * o.gpus * o.perGPU
	workloads := (total + o.replicas - 1) / o.replicas
	claims := make([]claimRef, total)
	tmpl := func(app string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	err := parallel(o.workers, workloads, func(w int) error {
		ns, name := fmt.Sprintf("team-%03d", w%o.namespaces), fmt.Sprintf("svc-%05d", w)
		sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: appsv1.DeploymentSpec{Selector: sel, Template: tmpl(name)}}
		if err := c.Create(ctx, d); err != nil {
			return err
		}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-7d9f8c6b5", OwnerReferences: ctrlRef("apps/v1", "Deployment", d)},
			Spec: appsv1.ReplicaSetSpec{Selector: sel, Template: tmpl(name)}}
		if err := c.Create(ctx, rs); err != nil {
			return err
		}
		for p := 0; p < o.replicas && w*o.replicas+p < total; p++ {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-p%04d", rs.Name, p), OwnerReferences: ctrlRef("apps/v1", "ReplicaSet", rs)},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			if err := c.Create(ctx, pod); err != nil {
				return err
			}
			claim := &resourcev1.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod.Name + "-gpu-c0000",
					Annotations:     map[string]string{rightsizing.PodClaimNameAnnotation: "gpu"},
					OwnerReferences: ctrlRef("v1", "Pod", pod)},
				Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
					Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.gpusharing.io",
						Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}}}}}}},
			}
			if err := c.Create(ctx, claim); err != nil {
				return err
			}
			claims[w*o.replicas+p] = claimRef{ns: ns, name: claim.Name, pod: pod.Name}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return claims, parallel(o.workers, o.nodes, func(n int) error {
		return c.Create(ctx, b.GPUNode(nodeName(n)))
	})
}

func nodeName(n int) string { return fmt.Sprintf("gpu-node-%05d", n) }

// publishAll writes every node's status as its agent would: each GPU sized per claim with its claims
// (spread so a workload's pods land on many nodes) and their pods among the consumers.
func publishAll(ctx context.Context, c client.Client, o options, claims []claimRef, used []int64) error {
	stride := o.nodes * o.gpus
	return parallel(o.workers, o.nodes, func(n int) error {
		gn := &v1.GPUNode{}
		if err := c.Get(ctx, client.ObjectKey{Name: nodeName(n)}, gn); err != nil {
			return err
		}
		gn.Status.GPUs = nil
		for g := range o.gpus {
			st := b.GPU(nodeName(n), int32(g))
			st.Applied = &v1.AppliedSharing{Strategy: v1.StrategyMPS, SpecHash: "bench",
				Sizing: &v1.Sizing{Mode: v1.SizingPerClaim, MemoryStep: ptr.To(resource.MustParse("512Mi"))}}
			st.Sized, st.Usage = &v1.GPUSizedClaims{}, &v1.GPUUsage{}
			for k := range o.perGPU {
				i := k*stride + n*o.gpus + g
				cl := claims[i]
				mem := resource.NewQuantity(used[i], resource.BinarySI)
				st.Sized.Claims = append(st.Sized.Claims, v1.SizedClaimStatus{Namespace: cl.ns, Name: cl.name, Pods: []string{cl.pod},
					Memory: ptr.To(resource.MustParse("10Gi")), MemoryUsed: mem})
				st.Usage.Consumers = append(st.Usage.Consumers, v1.GPUConsumer{Namespace: cl.ns, Pod: cl.pod, Container: "c",
					Memory: mem, SMUtilization: ptr.To(int32(20 + (i % 30)))})
			}
			gn.Status.GPUs = append(gn.Status.GPUs, st)
		}
		gn.Status.GPUCount = int32(o.gpus)
		return c.Status().Update(ctx, gn)
	})
}
