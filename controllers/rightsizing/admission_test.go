package rightsizing_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

// installPolicy applies config/admission/rightsizing_policy.yaml as users do, once per suite, and waits
// until the API server sizes a probe claim with it (admission policies take effect asynchronously).
func installPolicy(t *testing.T) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "admission", "rightsizing", "rightsizing_policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var obj client.Object
		if strings.Contains(doc, "kind: MutatingAdmissionPolicyBinding") {
			obj = &admissionv1.MutatingAdmissionPolicyBinding{}
		} else {
			obj = &admissionv1.MutatingAdmissionPolicy{}
		}
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, obj); client.IgnoreAlreadyExists(err) != nil {
			t.Fatalf("applying %s: %v", obj.GetName(), err)
		}
	}
	ns := namespace(t, "probe", nil, nil)
	rs := deployment(t, ns, "probe", "5f7b9c6d8", nil)
	recommendation(t, ns, v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "probe"}, v1.RightsizingInitial, "2Gi")
	p := pod(t, ns, "probe-5f7b9c6d8-abcde", ctrlRef("apps/v1", "ReplicaSet", rs))
	i := 0
	wait.For(t, 30*time.Second, func() error {
		i++
		c := claimFor(p, "gpu", "p"+strings.Repeat("x", 3)+string(rune('a'+i%26)), "10Gi")
		if err := env.Client.Create(ctx, c); err != nil {
			return err
		}
		if got := memoryOf(t, c); got != "2Gi" {
			return &notYet{got}
		}
		return nil
	}, "the admission policy sizes a probe claim")
}

type notYet struct{ got string }

func (n *notYet) Error() string { return "probe claim asks " + n.got }

func TestInitialModeSizesNewClaimsOnly(t *testing.T) {
	installPolicy(t)
	ctx := context.Background()
	ns := namespace(t, "a", nil, nil)
	web := deployment(t, ns, "web", "7d9f8c6b5", nil)
	recommendation(t, ns, v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "web"}, v1.RightsizingInitial, "3584Mi")
	// A workload opted out (mode Off) beside it, and a bare pod whose name looks like web's but is
	// not a pod of its ReplicaSets (one segment short).
	batch := deployment(t, ns, "batch", "6c8d9f7b4", nil)
	recommendation(t, ns, v1.WorkloadRef{Kind: v1.WorkloadDeployment, Name: "batch"}, v1.RightsizingOff, "1Gi")

	for _, tt := range []struct {
		name, pod, podClaim string
		owner               string
		want                string
	}{
		{"a new pod's claim of an Initial workload gets the recommendation", "web-7d9f8c6b5-x2x4z", "gpu", "web", "3584Mi"},
		{"a claim of another pod claim name is left alone", "web-7d9f8c6b5-b7k2m", "other", "web", "10Gi"},
		{"a workload in mode Off is never changed", "batch-6c8d9f7b4-q9w8e", "gpu", "batch", "10Gi"},
		{"a pod of another workload whose name starts alike is left alone", "web-extra-7d9f8c6b5-abcde", "gpu", "", "10Gi"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			owner := web
			if tt.owner == "batch" {
				owner = batch
			}
			p := pod(t, ns, tt.pod, ctrlRef("apps/v1", "ReplicaSet", owner))
			if tt.owner == "" {
				p = pod(t, ns, tt.pod+"x", nil)
			}
			c := claimFor(p, tt.podClaim, "z9z9z", "10Gi")
			create(t, c)
			if got := memoryOf(t, c); got != tt.want {
				t.Errorf("claim asks %s, want %s", got, tt.want)
			}
		})
	}

	// A namespace with no recommendation at all: claims pass as asked.
	empty := namespace(t, "empty", nil, nil)
	lone := claimFor(pod(t, empty, "web-7d9f8c6b5-l0n3e", nil), "gpu", "l0n3e", "10Gi")
	create(t, lone)
	if got := memoryOf(t, lone); got != "10Gi" {
		t.Errorf("a claim in a namespace without recommendations asks %s, want 10Gi", got)
	}

	// A running pod's claim is never changed: an update of an existing claim passes as written, even
	// once its workload's recommendation moved.
	p := pod(t, ns, "web-7d9f8c6b5-r4n7p", ctrlRef("apps/v1", "ReplicaSet", web))
	c := claimFor(p, "gpu", "r4n7p", "10Gi")
	create(t, c)
	if got := memoryOf(t, c); got != "3584Mi" {
		t.Fatalf("new claim asks %s, want 3584Mi", got)
	}
	allocate(t, c)
	var rec v1.GPUShareRecommendation
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "deployment-web-gpu"}, &rec); err != nil {
		t.Fatal(err)
	}
	rec.Status.InitialMemory = ptr.To(resource.MustParse("2Gi"))
	if err := env.Client.Status().Update(ctx, &rec); err != nil {
		t.Fatal(err)
	}
	n := 0
	wait.For(t, 30*time.Second, func() error {
		n++
		fresh := claimFor(pod(t, ns, fmt.Sprintf("web-7d9f8c6b5-n%04d", n), ctrlRef("apps/v1", "ReplicaSet", web)), "gpu", "n0000", "10Gi")
		create(t, fresh)
		if got := memoryOf(t, fresh); got != "2Gi" {
			return &notYet{got}
		}
		return nil
	}, "a new claim gets the moved recommendation")
	var after resourcev1.ResourceClaim
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), &after); err != nil {
		t.Fatal(err)
	}
	if got := memoryOf(t, &after); got != "3584Mi" {
		t.Errorf("the running pod's claim changed to %s", got)
	}
}
