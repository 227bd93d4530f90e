package app

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/test/wait"
)

// pluginClient dials the agent's DRA kubelet plugin in pluginDir as the kubelet does.
func pluginClient(t *testing.T, pluginDir string) drapb.DRAPluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

// prepareAsKubelet prepares claim through the plugin and returns how the kubelet names it; it retries, as
// the kubelet does, a claim whose device the plugin has not been told of yet.
func prepareAsKubelet(t *testing.T, ctx context.Context, kubelet drapb.DRAPluginClient, claim *resourcev1.ResourceClaim) *drapb.Claim {
	t.Helper()
	ref := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			return false, err.Error()
		}
		got := resp.Claims[string(claim.UID)]
		return got != nil && got.Error == "", fmt.Sprintf("prepare = %+v", got)
	}, "the claim prepared")
	return ref
}

// startDRANode starts an agent with one GPU that serves DRA alone (slices and the kubelet plugin, no
// device plugin), with its Node object, and returns it with the plugin's directories; with changes the
// options further.
func startDRANode(t *testing.T, with func(*Options)) (*testNode, dra.PluginConfig) {
	t.Helper()
	plugin := dra.PluginConfig{}
	n := startNodeWith(t, 1, func(o *Options) {
		o.DevicePlugin, o.PodResourcesSocket = nil, ""
		o.ResourceSlices = true
		root := filepath.Dir(o.MPSRoot)
		plugin = dra.PluginConfig{PluginDir: filepath.Join(root, "p"), RegistryDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi")}
		o.DRAPlugin = &plugin
		if with != nil {
			with(o)
		}
	})
	if err := env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		t.Fatal(err)
	}
	return n, plugin
}
