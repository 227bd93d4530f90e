package localnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// APIServerPort is fixed so the e2e overlay can point hostNetwork pods at https://127.0.0.1:16443: no
// kube-proxy runs, so the kubernetes Service's ClusterIP does not route.
const APIServerPort = 16443

// startControlPlane runs etcd and kube-apiserver (through envtest, with the authorizers and admission a
// real cluster has: Node and RBAC, NodeRestriction and ServiceAccount), then kube-controller-manager
// (its disruption controller keeps PDB status, its service account and root CA publishers give pods
// their tokens) and kube-scheduler, each under its own identity.
func (n *Node) startControlPlane(ctx context.Context) error {
	certDir := filepath.Join(n.Root, "pki")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: n.Bin, ControlPlaneStartTimeout: 2 * time.Minute}
	api := env.ControlPlane.GetAPIServer()
	api.CertDir = certDir
	api.SecureServing.Address = "127.0.0.1"
	api.SecureServing.Port = strconv.Itoa(APIServerPort)
	api.Out, api.Err = n.logFile("kube-apiserver"), n.logFile("kube-apiserver")
	args := api.Configure()
	args.Set("authorization-mode", "Node,RBAC")
	args.Disable("disable-admission-plugins")
	args.Set("enable-admission-plugins", "NodeRestriction")
	args.Set("advertise-address", "127.0.0.1")
	// The node's name does not resolve here; its InternalIP does (kubectl logs goes through it).
	args.Set("kubelet-preferred-address-types", "InternalIP,Hostname")
	etcd := &envtest.Etcd{}
	env.ControlPlane.Etcd = etcd
	etcd.DataDir = filepath.Join(n.Root, "etcd")
	etcd.Out, etcd.Err = n.logFile("etcd"), n.logFile("etcd")
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	n.env = env
	n.Config = cfg
	n.CAFile = filepath.Join(certDir, "ca.crt")
	if err := os.WriteFile(n.CAFile, cfg.CAData, 0o644); err != nil {
		return err
	}
	admin, err := n.kubeconfig("admin", envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}})
	if err != nil {
		return err
	}
	n.Kubeconfig = admin

	kcm, err := n.kubeconfig("kube-controller-manager", envtest.User{Name: "system:kube-controller-manager", Groups: []string{"system:masters"}})
	if err != nil {
		return err
	}
	p, err := n.start("kube-controller-manager", filepath.Join(n.Bin, "kube-controller-manager"),
		"--kubeconfig="+kcm, "--root-ca-file="+n.CAFile,
		"--service-account-private-key-file="+filepath.Join(certDir, "sa-signer.key"),
		"--use-service-account-credentials=false", "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port=0", "--controllers=*,-nodeipam,-cloud-node-lifecycle")
	if err != nil {
		return err
	}
	if err := n.waitHealthy(ctx, p, "kube-controller-manager"); err != nil {
		return err
	}
	sched, err := n.kubeconfig("kube-scheduler", envtest.User{Name: "system:kube-scheduler"})
	if err != nil {
		return err
	}
	_, err = n.start("kube-scheduler", filepath.Join(n.Bin, "kube-scheduler"),
		"--kubeconfig="+sched, "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0")
	return err
}

// waitHealthy waits until the controller manager has published the root CA into kube-system, which pods'
// service account volumes need.
func (n *Node) waitHealthy(ctx context.Context, p *proc, name string) error {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return err
	}
	return waitFor(ctx, name+" publishing kube-root-ca.crt", p, 90*time.Second, func() error {
		_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
}

// kubeconfig writes a kubeconfig for a client-certificate user of the API server.
func (n *Node) kubeconfig(name string, user envtest.User) (string, error) {
	u, err := n.env.AddUser(user, nil)
	if err != nil {
		return "", fmt.Errorf("user %s: %w", user.Name, err)
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.Root, "kubeconfig", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, data, 0o600)
}
