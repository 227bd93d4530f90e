package dra_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// startPublisher runs a publisher of nodeName's slices against env until the test ends (or the returned
// stop); o's Node, Kube and a nil Log are filled in.
func startPublisher(t *testing.T, env *testenv.Env, o dra.PublisherOptions) *dra.Publisher {
	t.Helper()
	p, _ := startStoppablePublisher(t, env, o)
	return p
}

func startStoppablePublisher(t *testing.T, env *testenv.Env, o dra.PublisherOptions) (*dra.Publisher, func()) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	o.Node, o.Kube = nodeName, kube
	if o.Log.GetSink() == nil {
		o.Log = testr.New(t)
	}
	p, err := dra.NewPublisher(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("publisher: %v", err)
		}
	}
	t.Cleanup(stop)
	return p, stop
}

// publish gives p devices and waits until the API server holds exactly them.
func publish(t *testing.T, ctx context.Context, env *testenv.Env, p *dra.Publisher, devices []resourcev1.Device) {
	t.Helper()
	p.Publish(devices)
	want := make([]string, 0, len(devices))
	for _, d := range devices {
		want = append(want, d.Name)
	}
	slices.Sort(want)
	waitPublished(t, ctx, env.Client, strings.Join(want, " "))
}

// nodeSlices lists nodeName's slices of the driver, by the fields the API server selects them on.
func nodeSlices(t *testing.T, ctx context.Context, c client.Client) []resourcev1.ResourceSlice {
	t.Helper()
	var list resourcev1.ResourceSliceList
	if err := c.List(ctx, &list, client.MatchingFields{resourcev1.ResourceSliceSelectorNodeName: nodeName, resourcev1.ResourceSliceSelectorDriver: dra.DriverName}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// published reads the node's pool as the scheduler takes it: the devices of its slices, sorted, and the
// generation, where every slice of the pool has one generation and the pool's slice count is there.
func published(t *testing.T, ctx context.Context, c client.Client) (names string, gen int64, complete bool) {
	t.Helper()
	items := nodeSlices(t, ctx, c)
	var devs []string
	complete = len(items) > 0
	for i, s := range items {
		if i == 0 {
			gen = s.Spec.Pool.Generation
		}
		if s.Spec.Pool.Name != nodeName || s.Spec.Pool.Generation != gen || s.Spec.Pool.ResourceSliceCount != int64(len(items)) {
			complete = false
		}
		for _, d := range s.Spec.Devices {
			devs = append(devs, d.Name)
		}
	}
	slices.Sort(devs)
	return strings.Join(devs, " "), gen, complete
}

// waitPublished waits until the node's pool is complete with the devices want (names sorted, joined by
// spaces) and returns its generation.
func waitPublished(t *testing.T, ctx context.Context, c client.Client, want string) int64 {
	t.Helper()
	var gen int64
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got, g, complete := published(t, ctx, c)
		gen = g
		return complete && got == want, fmt.Sprintf("generation %d complete %v: %q", g, complete, got)
	}, "the node's slices publish %q", want)
	return gen
}

func TestPoolsHoldAtMost128DevicesASlice(t *testing.T) {
	var devs []resourcev1.Device
	for i := range 300 {
		devs = append(devs, resourcev1.Device{Name: fmt.Sprintf("d-%03d", i)})
	}
	pool := dra.Pool(devs)
	var sizes []int
	var names []string
	for _, s := range pool.Slices {
		sizes = append(sizes, len(s.Devices))
		for _, d := range s.Devices {
			names = append(names, d.Name)
		}
	}
	if fmt.Sprint(sizes) != "[128 128 44]" || len(names) != 300 || names[0] != "d-000" || names[299] != "d-299" {
		t.Errorf("300 devices cut into slices of %v", sizes)
	}
	if empty := dra.Pool(nil); len(empty.Slices) != 1 || len(empty.Slices[0].Devices) != 0 {
		t.Errorf("a node without devices publishes %d slices; want one, empty", len(empty.Slices))
	}
}

// The slices are the node's, owned by its Node, in one pool named after it; a restarted agent that
// publishes the same devices writes nothing.
func TestAPublisherStartedAgainWithTheSameDevicesWritesNothing(t *testing.T) {
	ctx, env := draCluster(t)
	devices := dra.Devices(mixedNode(), share.DefaultConfig())
	first, stop := startStoppablePublisher(t, env, dra.PublisherOptions{})
	publish(t, ctx, env, first, devices)
	var owner corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: nodeName}, &owner); err != nil {
		t.Fatal(err)
	}
	for _, s := range nodeSlices(t, ctx, env.Client) {
		if refs := s.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].UID != owner.UID {
			t.Errorf("slice %s is owned by %+v, want the Node (uid %s)", s.Name, refs, owner.UID)
		}
	}
	stop()

	again := startPublisher(t, env, dra.PublisherOptions{})
	again.Publish(devices)
	wait.Until(t, 30*time.Second, again.Synced, "the restarted publisher synced the node's slices")
	if st := again.Stats(); st.NumCreates+st.NumUpdates+st.NumDeletes != 0 {
		t.Errorf("the restarted publisher wrote %+v for the devices already published", st)
	}
}

// A slice someone else deletes is put back, and so is one whose devices someone else changed. The slices
// are an earlier publisher's, as for an agent running a while: the controller trusts a slice it created
// itself over its informer for a minute (resourceslice.DefaultMutationCacheTTL), so one deleted sooner
// comes back only then.
func TestASliceDeletedOrChangedBySomeoneElseComesBack(t *testing.T) {
	ctx, env := draCluster(t)
	devices := dra.Devices(mixedNode(), share.DefaultConfig())
	first, stop := startStoppablePublisher(t, env, dra.PublisherOptions{})
	publish(t, ctx, env, first, devices)
	stop()
	p := startPublisher(t, env, dra.PublisherOptions{SyncDelay: 100 * time.Millisecond})
	p.Publish(devices)
	wait.Until(t, 30*time.Second, p.Synced, "the publisher synced the node's slices")
	want, _, _ := published(t, ctx, env.Client)

	items := nodeSlices(t, ctx, env.Client)
	if err := env.Client.Delete(ctx, &items[0]); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got, _, complete := published(t, ctx, env.Client)
		return complete && got == want, fmt.Sprintf("complete %v: %q", complete, got)
	}, "the deleted slice is back")

	s := nodeSlices(t, ctx, env.Client)[0]
	s.Spec.Devices = s.Spec.Devices[:1]
	if err := env.Client.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got, _, complete := published(t, ctx, env.Client)
		return complete && got == want, fmt.Sprintf("complete %v: %q", complete, got)
	}, "the changed slice is put back")
}

// eventsOn makes the node's GPUNode in env and a recorder of events.k8s.io events, as the agent's.
func eventsOn(t *testing.T, ctx context.Context, env *testenv.Env) (*v1alpha1.GPUNode, events.EventRecorder) {
	t.Helper()
	gpuNode := &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if err := env.Client.Create(ctx, gpuNode); err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
	stop := make(chan struct{})
	broadcaster.StartRecordingToSink(stop)
	t.Cleanup(func() { close(stop); broadcaster.Shutdown() })
	return gpuNode, broadcaster.NewRecorder(env.Scheme, "gpusharing-agent")
}

// waitEvent waits for an event of reason on the GPUNode and returns its note.
func waitEvent(t *testing.T, ctx context.Context, env *testenv.Env, gpuNode *v1alpha1.GPUNode, typ, reason string) string {
	t.Helper()
	var note string
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "GPUNode" && e.Regarding.Name == nodeName && e.Regarding.UID == gpuNode.UID && e.Reason == reason && e.Type == typ {
				note = e.Note
				return true, e.Note
			}
			seen = append(seen, e.Type+" "+e.Reason)
		}
		return false, fmt.Sprintf("events %v", seen)
	}, "a %s event %s on the GPUNode", typ, reason)
	return note
}

// sliceSeries reads the publishing series of nodeName from reg.
func sliceSeries(t *testing.T, reg prometheus.Gatherer) (failed, dropped, published float64) {
	t.Helper()
	s := prom.Gathered(t, reg, "reason")
	return s["gpusharing_agent_resourceslice_errors_total{/,failed,,"+nodeName+"}"],
		s["gpusharing_agent_resourceslice_errors_total{/,dropped_fields,,"+nodeName+"}"],
		s["gpusharing_agent_resourceslices_published{/,,,"+nodeName+"}"]
}

// A write the API server refuses reaches the user: a warning event on the node's GPUNode, the error
// counter and the published gauge at 0; once a write works again, a normal event and the gauge at 1.
func TestAPublishingErrorIsAnEventAndAMetric(t *testing.T) {
	ctx, env := draCluster(t)
	gpuNode, recorder := eventsOn(t, ctx, env)
	reg := prometheus.NewRegistry()
	m, err := dra.NewSliceMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPublisher(t, env, dra.PublisherOptions{Metrics: m, Events: recorder})

	// The GPUNode the events go to, then a device name the API server refuses (not a DNS label).
	p.PublishStatus(gpuNode)
	p.Publish([]resourcev1.Device{{Name: "GPU_0"}})
	note := waitEvent(t, ctx, env, gpuNode, corev1.EventTypeWarning, dra.ReasonSlicesNotPublished)
	if !strings.Contains(note, `"GPU_0"`) {
		t.Errorf("the event says %q; want the API server's reason", note)
	}
	if failed, _, published := sliceSeries(t, reg); failed < 1 || published != 0 {
		t.Errorf("after a refused write: %v errors, published %v; want the failed counter up and the gauge at 0", failed, published)
	}

	publish(t, ctx, env, p, dra.Devices(mixedNode(), share.DefaultConfig()))
	waitEvent(t, ctx, env, gpuNode, corev1.EventTypeNormal, dra.ReasonSlicesPublished)
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		failed, dropped, published := sliceSeries(t, reg)
		return published == 1, fmt.Sprintf("failed %v dropped %v published %v", failed, dropped, published)
	}, "the published gauge at 1")
}

// clusterWithout starts a real API server with the feature gate off and this test's node Ready.
func clusterWithout(t *testing.T, gate string) (context.Context, *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	env, err := testenv.StartWith(testenv.Options{APIServerFlags: map[string]string{"feature-gates": gate + "=false"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	if _, err := env.ReadyNode(ctx, nodeName); err != nil {
		t.Fatal(err)
	}
	return ctx, env
}

// Where DRAConsumableCapacity is off, the API server stores a sized GPU's device without what makes it
// shared: the user gets a warning event naming the gate and the dropped_fields counter, and the slice
// the API server stored counts as published.
func TestFieldsTheAPIServerDropsAreAnEvent(t *testing.T) {
	ctx, env := clusterWithout(t, "DRAConsumableCapacity")
	gpuNode, recorder := eventsOn(t, ctx, env)
	reg := prometheus.NewRegistry()
	m, err := dra.NewSliceMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPublisher(t, env, dra.PublisherOptions{Metrics: m, Events: recorder})
	gpuNode.Status = sizedNode()
	p.PublishStatus(gpuNode)
	note := waitEvent(t, ctx, env, gpuNode, corev1.EventTypeWarning, dra.ReasonSliceFieldsDropped)
	if !strings.Contains(note, "DRAConsumableCapacity") {
		t.Errorf("the event says %q; want the gate named", note)
	}
	wait.Until(t, 30*time.Second, p.Synced, "the publisher synced the node's slices")
	if _, dropped, published := sliceSeries(t, reg); dropped != 1 || published != 1 {
		t.Errorf("dropped_fields %v, published %v; want 1 and 1", dropped, published)
	}
	if st := p.Stats(); st.NumCreates != 1 || st.NumUpdates != 0 {
		t.Errorf("the controller wrote %+v; want the one create", st)
	}
}
