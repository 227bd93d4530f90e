package deviceplugin

import (
	"context"
	"fmt"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpusharing/gpusharing/agent/share"
)

// register tells the kubelet that p serves its resource. The kubelet dials the endpoint (a file name in
// its own directory) right away, so p must already be serving.
func register(ctx context.Context, cfg share.Config, p *plugin) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.RegisterTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+cfg.KubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing the kubelet at %s: %w", cfg.KubeletSocket(), err)
	}
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: string(p.resource),
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %w", p.resource, err)
	}
	return nil
}
