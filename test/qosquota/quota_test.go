// Package qosquota proves the admin's recipe for production classes (config/qos-quota, docs/deploy.md)
// against the real kube-apiserver and its ResourceQuota admission, with the quota controller of the real
// kube-controller-manager filling in each quota's status as in a cluster.
package qosquota

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpusharing/gpusharing/test/testenv"
	"github.com/gpusharing/gpusharing/test/wait"
)

const production = "gpusharing-production"

// recipe is config/qos-quota as an admin installs it: the kustomization, then a grant in each namespace
// allowed production pods and, where asked, a deny in a tenant namespace.
type recipe struct {
	env        *testenv.Env
	kubeconfig string
}

func install(t *testing.T, env *testenv.Env) *recipe {
	t.Helper()
	kcfg, err := env.AdminKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &recipe{env: env, kubeconfig: kcfg}
	r.namespace(t, "gpusharing-system") // config/default's, where the agent runs as system-node-critical
	r.kubectl(t, "apply", "-k", filepath.Join(env.RepoRoot, "config", "qos-quota"))
	cm, err := env.StartControllerManager(t.TempDir(), "resourcequota")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cm.Stop()
		if t.Failed() {
			t.Logf("kube-controller-manager log (tail):\n%s", cm.LogTail(3000))
		}
	})
	return r
}

func (r *recipe) kubectl(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(r.env.BinDir, "kubectl"), append([]string{"--kubeconfig", r.kubeconfig}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (r *recipe) namespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := r.env.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// quota applies one of the recipe's per-namespace quotas in ns and waits for the quota controller to
// fill in its status (until then the admission plugin refuses every pod the quota covers).
func (r *recipe) quota(t *testing.T, file, ns string) {
	t.Helper()
	r.namespace(t, ns)
	r.kubectl(t, "apply", "-n", ns, "-f", filepath.Join(r.env.RepoRoot, "config", "qos-quota", file))
	r.counted(t, ns)
}

// counted waits until every quota of ns has its status filled in.
func (r *recipe) counted(t *testing.T, ns string) {
	t.Helper()
	wait.For(t, 60*time.Second, func() error {
		var l corev1.ResourceQuotaList
		if err := r.env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return fmt.Errorf("no quota")
		}
		for _, q := range l.Items {
			if q.Status.Hard == nil || q.Status.Used == nil {
				return fmt.Errorf("quota %s has no status yet", q.Name)
			}
		}
		return nil
	}, "the quota controller counting namespace %s", ns)
}

// pod creates a pod of the given PriorityClass ("" for none) in ns.
func (r *recipe) pod(ns, class string) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "workload-", Namespace: ns},
		Spec: corev1.PodSpec{PriorityClassName: class, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	return r.env.Client.Create(context.Background(), p)
}

func start(t *testing.T, o testenv.Options) *testenv.Env {
	t.Helper()
	env, err := testenv.StartWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}

// admitted creates a pod that must be admitted, waiting out the moments after the recipe was applied
// in which the Priority admission plugin's informer does not know the class yet.
func (r *recipe) admitted(t *testing.T, ns, class string) {
	t.Helper()
	wait.For(t, 30*time.Second, func() error {
		err := r.pod(ns, class)
		if err != nil && strings.Contains(err.Error(), "no PriorityClass with name") {
			return err
		}
		if err != nil {
			t.Fatalf("a pod of class %q in %s: refused: %v", class, ns, err)
		}
		return nil
	}, "a pod of class %q admitted in %s", class, ns)
}

func (r *recipe) refused(t *testing.T, ns, class, why string) {
	t.Helper()
	err := r.pod(ns, class)
	if err == nil {
		t.Fatalf("a pod of class %q in %s: admitted, want refused (%s)", class, ns, why)
	}
	if !strings.Contains(err.Error(), why) {
		t.Fatalf("a pod of class %q in %s: refused with %v, want: %s", class, ns, err, why)
	}
}

// With the admission configuration, a namespace without a grant cannot create a production pod, nor one
// of a system class (which every productionPriority lets through); a granted namespace can, and the
// system namespaces keep their classes.
func TestAdmissionConfigurationRefusesProductionWithoutAGrant(t *testing.T) {
	env := start(t, testenv.Options{APIServerFlags: map[string]string{
		"admission-control-config-file": filepath.Join(testenv.RepoRoot(), "config", "qos-quota", "admission-configuration.yaml"),
	}})
	r := install(t, env)
	r.quota(t, "production-grant.yaml", "serving")
	r.counted(t, "kube-system")
	r.counted(t, "gpusharing-system")
	r.namespace(t, "tenant")

	r.admitted(t, "serving", production)
	r.refused(t, "tenant", production, "insufficient quota to match these scopes")
	r.refused(t, "tenant", "system-cluster-critical", "insufficient quota to match these scopes")
	r.refused(t, "tenant", "system-node-critical", "insufficient quota to match these scopes")
	r.admitted(t, "tenant", "")
	r.admitted(t, "kube-system", "system-cluster-critical")
	r.admitted(t, "gpusharing-system", "system-node-critical")
}

// Without the admission configuration (a managed cluster's API server), the deny quota in a tenant
// namespace refuses production pods there; a namespace with neither quota is open, which is why the
// admission configuration is the recipe's default.
func TestDenyQuotaRefusesProductionWhereTheAPIServerCannotBeConfigured(t *testing.T) {
	env := start(t, testenv.Options{})
	r := install(t, env)
	r.quota(t, "tenant-deny.yaml", "tenant")
	r.namespace(t, "unlisted")

	r.admitted(t, "unlisted", production)
	r.refused(t, "tenant", production, "exceeded quota: gpusharing-production-deny")
	r.refused(t, "tenant", "system-cluster-critical", "exceeded quota: gpusharing-production-deny")
	r.admitted(t, "tenant", "")
}
