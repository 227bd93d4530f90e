// Package testenv starts a real kube-apiserver and etcd (built into bin/ by hack/build-control-plane.sh)
// with gpusharing's CRDs installed, for tests that must talk to the real API server rather than a fake.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	gpusharingv1alpha1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Env is a running API server with the CRDs installed.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	// RepoRoot is the repository's root directory, for tests that read config/ or run bin/ tools.
	RepoRoot string
	// BinDir holds kube-apiserver, etcd and kubectl.
	BinDir string

	env *envtest.Environment
	// wrapDir holds the links through which etcd and kube-apiserver die with the test process.
	wrapDir string
}

// RepoRoot finds the repository root from this source file's location, so tests work from any package.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Scheme returns a scheme with the built-in kinds and gpusharing's.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := gpusharingv1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Start runs kube-apiserver and etcd from bin/ (or $KUBEBUILDER_ASSETS) and installs the CRDs from
// config/crd/bases. It fails with a clear message when the binaries have not been built.
func Start() (*Env, error) { return start(true) }

// StartForTest is Start for one test: a failure to start fails it, and the control plane stops when
// it ends.
func StartForTest(t testing.TB) *Env {
	t.Helper()
	env, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}

// StartWithoutCRDs is Start for tests that install the CRDs themselves (the Helm chart's tests).
func StartWithoutCRDs() (*Env, error) { return start(false) }

func start(installCRDs bool) (*Env, error) {
	root := RepoRoot()
	bin := os.Getenv("KUBEBUILDER_ASSETS")
	if bin == "" {
		bin = filepath.Join(root, "bin")
	}
	return startAt(root, bin, installCRDs)
}

// StartAt is Start for a checkout at root and binaries in bin, for programs that run where the source
// tree they were built from is not (test/gpu/stack runs on the GPU machine).
func StartAt(root, bin string) (*Env, error) { return startAt(root, bin, true) }

// Options change how the API server runs.
type Options struct {
	// APIServerFlags are added to kube-apiserver's command line (name without dashes: value), for
	// example an audit log a test counts requests in.
	APIServerFlags map[string]string
}

// StartWith is Start with options.
func StartWith(o Options) (*Env, error) {
	root := RepoRoot()
	bin := os.Getenv("KUBEBUILDER_ASSETS")
	if bin == "" {
		bin = filepath.Join(root, "bin")
	}
	return startWith(root, bin, true, o)
}

func startAt(root, bin string, installCRDs bool) (*Env, error) {
	return startWith(root, bin, installCRDs, Options{})
}

func startWith(root, bin string, installCRDs bool, o Options) (*Env, error) {
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run 'make control-plane' (it builds the real binaries from the Go module proxy): %w", name, bin, err)
		}
	}
	s := Scheme()
	wrapDir, err := dyingBinDir(bin)
	if err != nil {
		return nil, fmt.Errorf("preparing the control plane to die with the test process: %w", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: bin,
		Scheme:                s,
	}
	// Explicit paths: envtest would take $KUBEBUILDER_ASSETS over any directory given to it.
	env.ControlPlane.GetAPIServer().Path = filepath.Join(wrapDir, "kube-apiserver")
	env.ControlPlane.Etcd = &envtest.Etcd{Path: filepath.Join(wrapDir, "etcd")}
	env.ControlPlane.KubectlPath = filepath.Join(bin, "kubectl")
	for name, value := range o.APIServerFlags {
		env.ControlPlane.GetAPIServer().Configure().Set(name, value)
	}
	if installCRDs {
		env.CRDDirectoryPaths = []string{filepath.Join(root, "config", "crd", "bases")}
		env.ErrorIfCRDPathMissing = true
	}
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(wrapDir)
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", bin, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = env.Stop()
		_ = os.RemoveAll(wrapDir)
		return nil, fmt.Errorf("building a client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: s, RepoRoot: root, BinDir: bin, env: env, wrapDir: wrapDir}, nil
}

// Stop ends the API server and etcd.
func (e *Env) Stop() error {
	err := e.env.Stop()
	_ = os.RemoveAll(e.wrapDir)
	return err
}

// GVR names the resources the tests list.
var (
	PolicyResource = schema.GroupVersionResource{Group: gpusharingv1alpha1.GroupVersion.Group, Version: "v1alpha1", Resource: "gpusharingpolicies"}
	NodeResource   = schema.GroupVersionResource{Group: gpusharingv1alpha1.GroupVersion.Group, Version: "v1alpha1", Resource: "gpunodes"}
)

// AdminKubeconfig writes a kubeconfig for a system:masters user of this API server into dir and returns
// its path, so tests can run the real kubectl against it.
func (e *Env) AdminKubeconfig(dir string) (string, error) {
	user, err := e.env.AddUser(envtest.User{Name: "gpusharing-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("adding an admin user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	// Replaced whole by a rename: a component started earlier with the same file may still be reading it.
	path := filepath.Join(dir, "kubeconfig")
	f, err := os.CreateTemp(dir, ".kubeconfig-*")
	if err != nil {
		return "", err
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Close()); err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return path, nil
}

// Main is a package's TestMain for suites that share one API server: it starts it into *env, runs the
// tests, stops it and exits with the tests' code.
func Main(m *testing.M, env **Env) { main(m, env, Start) }

// MainWithoutCRDs is Main with StartWithoutCRDs.
func MainWithoutCRDs(m *testing.M, env **Env) { main(m, env, StartWithoutCRDs) }

func main(m *testing.M, env **Env, start func() (*Env, error)) {
	e, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
	}
	os.Exit(code)
}
