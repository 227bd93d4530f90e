package simnode

import (
	"context"
	"os"
	"testing"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StartForTest registers n's Node through c and runs its agent under cfg's identity until ctx ends,
// its host directories in a temporary folder removed (and its stand-in MPS daemons stopped) when the
// test ends. A manager failure is sent to errs.
func StartForTest(t testing.TB, ctx context.Context, c client.Client, cfg *rest.Config, scheme *k8sruntime.Scheme, n Node, errs chan<- error) {
	t.Helper()
	// os.MkdirTemp, not t.TempDir: the agent's Unix socket paths must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "simnode")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { StopDaemons(dir); _ = os.RemoveAll(dir) })
	if err := CreateNode(ctx, c, n); err != nil {
		t.Fatal(err)
	}
	if err := Start(ctx, cfg, scheme, n, dir, errs); err != nil {
		t.Fatal(err)
	}
}
