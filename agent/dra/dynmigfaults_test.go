package dra_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// migNode is one simulated GPU node with dynamic MIG on its GPU 0: the mock survives the agents a test
// starts and kills, as the GPU survives the agent's process.
type migNode struct {
	server *nvmlmock.Server
	nvml   *gpu.NVML
	dev    gpu.Device
	dirs   pluginDirs
	// device is the placement device the claims get: the last placement of the GPU's 3-slice profile.
	device string
	at     gpu.Placement
	prof   gpu.Profile
}

// dynamicModels are the GPU models the faults run on: the H100's recorded geometry, and each model
// recorded by test/gpu/mig/record.py.
func dynamicModels() []string {
	models := []string{"H100"}
	for _, f := range nvmlmock.Recorded() {
		if f == "nvidia-h200.json" {
			models = append(models, "H200")
		}
	}
	return models
}

func newMIGNode(t *testing.T, model string) *migNode {
	t.Helper()
	server, err := nvmlmock.NewNode(model, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	server.GPUs[0].SetMIGMode(true, true)
	n := &migNode{server: server, nvml: gpu.NewNVML(server), dirs: newPluginDirs(t)}
	if n.dev, err = n.nvml.Device(context.Background(), server.GPUs[0].UUID); err != nil {
		t.Fatal(err)
	}
	for _, p := range n.dev.Profiles {
		if p.SliceCount == 3 && n.prof.Name == "" {
			n.prof, n.at = p, p.Placements[len(p.Placements)-1]
		}
	}
	n.device = fmt.Sprintf("gpu-0-mig-%s-%d", strings.ReplaceAll(n.prof.Name, ".", "-"), n.at.Start)
	return n
}

// agent starts an agent's kubelet plugin over the node's directories and GPU, as after a (re)start:
// the ledger and the checkpoint are read from disk.
func (n *migNode) agent(t *testing.T) (*dra.KubeletPlugin, *dra.DynamicMIG) {
	t.Helper()
	p, err := dra.NewKubeletPlugin(nodeName, n.dirs.config(), dpConfig, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	m, err := dra.NewDynamicMIG(n.dirs.plugin, n.nvml, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	p.MIG = m
	p.Update(dynamicStatus(n.dev, []string{n.prof.Name}))
	return p, m
}

// instances lists the MIG instances NVML shows on the GPU.
func (n *migNode) instances(t *testing.T) []gpu.Instance {
	t.Helper()
	d, err := n.nvml.Device(context.Background(), n.dev.UUID)
	if err != nil {
		t.Fatal(err)
	}
	return d.Instances
}

// wantOneInstance checks the GPU holds exactly one instance, at the claims' placement, and the ledger
// exactly its record.
func (n *migNode) wantOneInstance(t *testing.T, m *dra.DynamicMIG) {
	t.Helper()
	ins, recs := n.instances(t), m.Records()
	if len(ins) != 1 || ins[0].Placement != n.at || len(recs) != 1 || !recs[0].Created || recs[0].UUID != ins[0].UUID {
		t.Fatalf("instances %+v, ledger %+v; want one %s at %s, recorded", ins, recs, n.prof.Name, n.at)
	}
}

func (n *migNode) wantNoInstance(t *testing.T, m *dra.DynamicMIG) {
	t.Helper()
	if ins, recs := n.instances(t), m.Records(); len(ins) != 0 || len(recs) != 0 {
		t.Fatalf("instances %+v, ledger %+v; want none (no orphan)", ins, recs)
	}
}

func kubeOf(t *testing.T, env *testenv.Env) kubernetes.Interface {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// failNth fails the n-th write through it (1-based) and every one after: the agent died there.
type failNth struct {
	n, writes int
}

func (f *failNth) write(path string, data []byte, perm os.FileMode) error {
	f.writes++
	if f.writes >= f.n {
		return errDiskFull
	}
	return dra.WriteFileAtomic(path, data, perm)
}

func TestDynamicMIGFaults(t *testing.T) {
	ctx := context.Background()
	env := testenv.StartForTest(t)
	c, kube := env.Client, kubeOf(t, env)
	for _, model := range dynamicModels() {
		t.Run(model, func(t *testing.T) {
			claim := func(name string, n *migNode) *resourcev1.ResourceClaim {
				name = strings.ToLower(model) + "-" + name
				heldClaim(t, ctx, c, name, dra.DriverName, nodeName, n.device)
				return getClaim(t, ctx, c, name)
			}

			t.Run("killed after the create, before the ledger records it", func(t *testing.T) {
				n := newMIGNode(t, model)
				cl := claim("after-create", n)
				p, m := n.agent(t)
				// Write 1 is the intent, write 2 the record of the created instance: the agent dies there.
				dra.SetMIGLedgerWriter(m, (&failNth{n: 2}).write)
				if err := prepareOne(ctx, p, cl); !errors.Is(err, errDiskFull) {
					t.Fatalf("prepare = %v, want the write's error", err)
				}
				if len(n.instances(t)) != 1 {
					t.Fatalf("the create did not happen before the kill: %+v", n.instances(t))
				}
				// The restarted agent destroys the interrupted create's instance; the kubelet's retry
				// creates one, once.
				p, m = n.agent(t)
				if err := m.Reconcile(ctx, kube); err != nil {
					t.Fatal(err)
				}
				n.wantNoInstance(t, m)
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatalf("the kubelet's retry = %v", err)
				}
				n.wantOneInstance(t, m)
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatalf("prepared again = %v", err)
				}
				n.wantOneInstance(t, m)
			})

			t.Run("a ledger write that fails after the create, retried by the same agent", func(t *testing.T) {
				n := newMIGNode(t, model)
				cl := claim("retried", n)
				p, m := n.agent(t)
				disk := &failNth{n: 2}
				dra.SetMIGLedgerWriter(m, disk.write)
				if err := prepareOne(ctx, p, cl); !errors.Is(err, errDiskFull) {
					t.Fatalf("prepare = %v, want the write's error", err)
				}
				// The disk works again: the kubelet's retry finds the intent and its instance, starts over,
				// and leaves one instance.
				dra.SetMIGLedgerWriter(m, dra.WriteFileAtomic)
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatalf("the kubelet's retry = %v", err)
				}
				n.wantOneInstance(t, m)
			})

			t.Run("killed after the ledger, before the checkpoint", func(t *testing.T) {
				n := newMIGNode(t, model)
				cl := claim("after-ledger", n)
				p, _ := n.agent(t)
				dra.SetCheckpointWriter(p, (&failNth{n: 1}).write)
				if err := prepareOne(ctx, p, cl); !errors.Is(err, errDiskFull) {
					t.Fatalf("prepare = %v, want the write's error", err)
				}
				// The restarted agent keeps the instance of the claim that still exists and hands it over
				// on the kubelet's retry: no second instance.
				p, m := n.agent(t)
				if err := m.Reconcile(ctx, kube); err != nil {
					t.Fatal(err)
				}
				n.wantOneInstance(t, m)
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatalf("the kubelet's retry = %v", err)
				}
				n.wantOneInstance(t, m)
				if err := unprepareOne(ctx, p, cl); err != nil {
					t.Fatal(err)
				}
				n.wantNoInstance(t, m)
			})

			t.Run("killed after the claim's deletion, before the destroy", func(t *testing.T) {
				n := newMIGNode(t, model)
				cl := claim("deleted", n)
				p, m := n.agent(t)
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatal(err)
				}
				n.wantOneInstance(t, m)
				if err := c.Delete(ctx, cl); err != nil {
					t.Fatal(err)
				}
				// No unprepare reached this agent; the next one finds the claim gone.
				_, m = n.agent(t)
				if err := m.Reconcile(ctx, kube); err != nil {
					t.Fatal(err)
				}
				n.wantNoInstance(t, m)
			})

			t.Run("a placement taken behind the agent's back", func(t *testing.T) {
				n := newMIGNode(t, model)
				cl := claim("taken", n)
				p, m := n.agent(t)
				foreign, err := n.nvml.CreateGPUInstance(ctx, n.dev.UUID, n.prof, n.at)
				if err != nil {
					t.Fatal(err)
				}
				err = prepareOne(ctx, p, cl)
				want := fmt.Sprintf("instances there now: [%s at %s (GI %d)]", n.prof.Name, n.at, foreign.GIID)
				if !errors.Is(err, dra.ErrPlacementTaken) || !strings.Contains(err.Error(), want) {
					t.Fatalf("prepare = %v; want ErrPlacementTaken naming %q", err, want)
				}
				if recs := m.Records(); len(recs) != 0 {
					t.Fatalf("a failed create left ledger records %+v", recs)
				}
				if err := n.nvml.DestroyInstance(ctx, n.dev.UUID, foreign.GIID); err != nil {
					t.Fatal(err)
				}
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatalf("prepare once the placement is free = %v", err)
				}
				n.wantOneInstance(t, m)
				// The container gets the instance's MIG device.
				env := readCDI(t, n.dirs.cdi, string(cl.UID)).Devices[0].ContainerEdits.Env
				if want := "NVIDIA_VISIBLE_DEVICES=" + m.Records()[0].UUID; !slices.Contains(env, want) {
					t.Errorf("CDI env %v; want %s", env, want)
				}
			})

			t.Run("unprepare waits for the instance's processes", func(t *testing.T) {
				n := newMIGNode(t, model)
				cl := claim("busy", n)
				p, m := n.agent(t)
				if err := prepareOne(ctx, p, cl); err != nil {
					t.Fatal(err)
				}
				in := n.instances(t)[0]
				proc := nvmlmock.Proc(4242, 1<<30, 50)
				proc.GI, proc.CI = in.GIID, in.CIID
				n.server.GPUs[0].SetUsage(proc)
				if err := unprepareOne(ctx, p, cl); !errors.Is(err, dra.ErrInstanceBusy) || !strings.Contains(err.Error(), "4242") {
					t.Fatalf("unprepare with a process on the instance = %v, want ErrInstanceBusy naming pid 4242", err)
				}
				n.wantOneInstance(t, m)
				n.server.GPUs[0].SetUsage()
				if err := unprepareOne(ctx, p, cl); err != nil {
					t.Fatal(err)
				}
				n.wantNoInstance(t, m)
			})
		})
	}
}

// A ledger the agent cannot read stops it with the reason: moving it aside would orphan its instances.
func TestAnUnreadableMIGLedgerStopsTheAgent(t *testing.T) {
	n := newMIGNode(t, "H100")
	if err := os.MkdirAll(n.dirs.plugin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.dirs.plugin, dra.DynamicMIGFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := dra.NewDynamicMIG(n.dirs.plugin, n.nvml, testr.New(t))
	if err == nil || !strings.Contains(err.Error(), "fix or remove it after destroying its MIG instances") {
		t.Errorf("NewDynamicMIG over an unreadable ledger = %v", err)
	}
}
