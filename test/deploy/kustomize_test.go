package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The namespace and service accounts config/default installs (namePrefix gpusharing-).
const (
	namespace      = "gpusharing-system"
	managerAccount = "system:serviceaccount:" + namespace + ":gpusharing-manager"
	agentAccount   = "system:serviceaccount:" + namespace + ":gpusharing-agent"
)

var (
	installOnce sync.Once
	installOut  string
	installErr  error
)

func kubectl(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	kubeconfig, err := env.AdminKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(env.BinDir, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl not built in %s: run 'make control-plane'", env.BinDir)
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// install renders config/default and applies it, once for the package.
func install(t *testing.T) string {
	t.Helper()
	installOnce.Do(func() {
		var rendered string
		rendered, installErr = kubectl(t, "", "kustomize", filepath.Join(env.RepoRoot, "config", "default"))
		if installErr != nil {
			installOut = rendered
			return
		}
		installOut, installErr = kubectl(t, rendered, "apply", "--server-side", "--force-conflicts", "-f", "-")
	})
	if installErr != nil {
		t.Fatalf("installing config/default: %v\n%s", installErr, installOut)
	}
	return installOut
}

func TestAPIServerAcceptsEveryObjectOfConfigDefault(t *testing.T) {
	out := install(t)
	for _, want := range []string{
		"namespace/gpusharing-system",
		"customresourcedefinition.apiextensions.k8s.io/gpusharingpolicies.gpusharing.io",
		"customresourcedefinition.apiextensions.k8s.io/gpunodes.gpusharing.io",
		"serviceaccount/gpusharing-manager", "serviceaccount/gpusharing-agent",
		"clusterrole.rbac.authorization.k8s.io/gpusharing-manager", "clusterrole.rbac.authorization.k8s.io/gpusharing-agent",
		"clusterrolebinding.rbac.authorization.k8s.io/gpusharing-manager", "clusterrolebinding.rbac.authorization.k8s.io/gpusharing-agent",
		"role.rbac.authorization.k8s.io/gpusharing-leader-election", "rolebinding.rbac.authorization.k8s.io/gpusharing-leader-election",
		"deployment.apps/gpusharing-manager", "daemonset.apps/gpusharing-agent",
		"clusterrole.rbac.authorization.k8s.io/gpusharing-agent-dra", "clusterrolebinding.rbac.authorization.k8s.io/gpusharing-agent-dra",
		"validatingadmissionpolicy.admissionregistration.k8s.io/gpusharing-agent-own-gpunode",
		"validatingadmissionpolicy.admissionregistration.k8s.io/gpusharing-agent-own-resourceslices",
		"validatingadmissionpolicy.admissionregistration.k8s.io/gpusharing-agent-own-evictions",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl apply of config/default did not create %s:\n%s", want, out)
		}
	}
}

// The agent's ResourceSlice rights come with config/dra alone: config/core (the operator without DRA)
// grants none, config/dra binds them to config/core's agent, and config/default is the two.
func TestOnlyConfigDRAGrantsTheAgentResourceSlices(t *testing.T) {
	for dir, want := range map[string]bool{"core": false, "dra": true, "default": true} {
		out, err := kubectl(t, "", "kustomize", filepath.Join(env.RepoRoot, "config", dir))
		if err != nil {
			t.Fatalf("kustomize config/%s: %v\n%s", dir, err, out)
		}
		objs, err := decodeObjects(out)
		if err != nil {
			t.Fatal(err)
		}
		roles := map[string]bool{}
		for _, o := range objs {
			if o.Kind == "ClusterRole" && strings.Contains(string(o.Raw), "resourceslices") {
				roles[o.Name] = true
			}
		}
		granted := false
		for _, o := range objs {
			if o.Kind != "ClusterRoleBinding" {
				continue
			}
			var b rbacv1.ClusterRoleBinding
			if err := yaml.Unmarshal(o.Raw, &b); err != nil {
				t.Fatal(err)
			}
			for _, s := range b.Subjects {
				if roles[b.RoleRef.Name] && "system:serviceaccount:"+s.Namespace+":"+s.Name == agentAccount {
					granted = true
				}
			}
		}
		if granted != want {
			t.Errorf("config/%s grants the agent's service account resourceslices: %v, want %v", dir, granted, want)
		}
	}
}

type object struct {
	Kind, Name string
	Raw        []byte
}

// decodeObjects splits a rendered stream into its objects' kinds, names and YAML.
func decodeObjects(stream string) ([]object, error) {
	var out []object
	for _, doc := range strings.Split(stream, "\n---\n") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, err
		}
		if meta.Kind != "" {
			out = append(out, object{Kind: meta.Kind, Name: meta.Metadata.Name, Raw: []byte(doc)})
		}
	}
	return out, nil
}
