package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourcev1 "k8s.io/api/resource/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// draKubelet is the kubelet's side of the DRA kubelet plugin API (k8s.io/kubelet/pkg/apis/dra/v1): it
// dials the plugin's socket as the kubelet does once the plugin registered (nothing registers it here:
// the registration only tells a kubelet where the socket is).
type draKubelet struct {
	conn   *grpc.ClientConn
	plugin drapb.DRAPluginClient
}

// dialDRA connects to <pluginDir>/dra.sock; grpc connects lazily, so the first call waits for the socket.
func dialDRA(pluginDir string) (*draKubelet, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &draKubelet{conn: conn, plugin: drapb.NewDRAPluginClient(conn)}, nil
}

func (k *draKubelet) close() { _ = k.conn.Close() }

func claimRef(c *resourcev1.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// prepare calls NodePrepareResources for the claim, as the kubelet does before the pod's containers
// start, retrying as the kubelet does while the plugin refuses (until timeout), and returns the CDI
// device IDs of the claim's devices. The devices must be the allocation's, as the kubelet checks.
func (k *draKubelet) prepare(ctx context.Context, claim *resourcev1.ResourceClaim, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ids, err := k.prepareOnce(ctx, claim)
		if err == nil {
			return ids, nil
		}
		last = err
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not prepared within %s: %w", timeout, last)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (k *draKubelet) prepareOnce(ctx context.Context, claim *resourcev1.ResourceClaim) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := k.plugin.NodePrepareResources(cctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(claim)}})
	if err != nil {
		return nil, err
	}
	got := resp.GetClaims()[string(claim.UID)]
	switch {
	case got == nil:
		return nil, fmt.Errorf("no answer for claim %s", claim.Name)
	case got.GetError() != "":
		return nil, fmt.Errorf("claim %s: %s", claim.Name, got.GetError())
	}
	return preparedIDs(claim, got.GetDevices())
}

// preparedIDs checks the plugin's devices against the claim's allocation (each one the allocation's
// pool, device and share id) and returns their CDI device IDs.
func preparedIDs(claim *resourcev1.ResourceClaim, devs []*drapb.Device) ([]string, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s is not allocated", claim.Name)
	}
	var ids []string
	for _, d := range devs {
		match := false
		for _, r := range claim.Status.Allocation.Devices.Results {
			share := ""
			if r.ShareID != nil {
				share = string(*r.ShareID)
			}
			if r.Pool == d.GetPoolName() && r.Device == d.GetDeviceName() && share == d.GetShareId() {
				match = true
			}
		}
		if !match {
			return nil, fmt.Errorf("claim %s: the plugin prepared %s/%s share %q, not in the allocation", claim.Name, d.GetPoolName(), d.GetDeviceName(), d.GetShareId())
		}
		ids = append(ids, d.GetCdiDeviceIds()...)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("claim %s: prepared with no CDI device", claim.Name)
	}
	return ids, nil
}

// unprepare calls NodeUnprepareResources for the claim, as the kubelet does once the pod is gone.
func (k *draKubelet) unprepare(ctx context.Context, claim *resourcev1.ResourceClaim) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := k.plugin.NodeUnprepareResources(cctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claimRef(claim)}})
	if err != nil {
		return err
	}
	got := resp.GetClaims()[string(claim.UID)]
	switch {
	case got == nil:
		return fmt.Errorf("no answer for claim %s", claim.Name)
	case got.GetError() != "":
		return fmt.Errorf("claim %s: %s", claim.Name, got.GetError())
	}
	return nil
}
