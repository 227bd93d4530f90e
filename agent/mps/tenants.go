package mps

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpusharing/gpusharing/agent/hostpath"
)

// A GPU's own daemon serves every client that mounts its pipe directory: the device plugin's, whose
// Allocate cannot tell which pod it serves. The DRA kubelet plugin knows each claim's namespace, and
// gives each namespace on a GPU a daemon of its own, with its own pipe directory, log directory and
// /dev/shm tmpfs: clients of one namespace then cannot reach another namespace's sockets or shared
// memory, nor fill its tmpfs. Several control daemons serve one GPU at once in compute mode Default
// (measured on the H100, docs/mps.md); their clients time-slice against each other like separate
// processes.

// Tenant is one namespace's MPS daemon on a GPU.
type Tenant struct {
	GPU       string
	Namespace string
}

// ErrBadNamespace is returned for a namespace that is not a DNS label, which a directory must not be
// named after (it could name a path).
var ErrBadNamespace = errors.New("not a Kubernetes namespace name")

func tenantKey(uuid, namespace string) (key, error) {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return key{}, fmt.Errorf("%w: %q: %s", ErrBadNamespace, namespace, strings.Join(errs, "; "))
	}
	return key{gpu: uuid, ns: namespace}, nil
}

// TenantPipeDir is the namespace's CUDA_MPS_PIPE_DIRECTORY on the GPU.
func (m *Manager) TenantPipeDir(uuid, namespace string) string {
	return m.pipeDir(key{gpu: uuid, ns: namespace})
}

// TenantShmDir is the namespace's /dev/shm tmpfs on the GPU.
func (m *Manager) TenantShmDir(uuid, namespace string) string {
	return m.shmDir(key{gpu: uuid, ns: namespace})
}

// EnsureTenant makes the namespace's daemon on the GPU run, with the GPU's settings: it adopts one a
// previous agent left running (its clients keep their connections) and starts one when there is none.
// A running daemon whose settings differ is not restarted: its namespace's clients keep it, and the new
// settings are sent for the servers it starts later.
func (m *Manager) EnsureTenant(ctx context.Context, uuid, namespace string, s Settings) (Status, error) {
	k, err := tenantKey(uuid, namespace)
	if err != nil {
		return Status{}, err
	}
	m.ops.Lock()
	defer m.ops.Unlock()
	return m.ensure(ctx, k, s)
}

// StopTenant quits the namespace's daemon on the GPU and removes its directories, refusing with
// GPUBusy while clients are connected. A namespace without a daemon costs no command.
func (m *Manager) StopTenant(ctx context.Context, uuid, namespace string) error {
	k, err := tenantKey(uuid, namespace)
	if err != nil {
		return err
	}
	m.ops.Lock()
	defer m.ops.Unlock()
	return m.stop(ctx, k)
}

// TenantStatus is the namespace's daemon's state on the GPU, and false when the manager runs none.
func (m *Manager) TenantStatus(uuid, namespace string) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.daemons[key{gpu: uuid, ns: namespace}]
	if !ok {
		return Status{}, false
	}
	return d.status(), true
}

// Tenants lists the namespace daemons of the node: those running now, whether this manager started them
// or a previous agent did, and those this manager watches while they wait out a restart backoff, sorted
// by GPU and namespace. It reads the directories and the pid records and runs no command.
func (m *Manager) Tenants() []Tenant {
	seen := map[Tenant]bool{}
	m.mu.Lock()
	for k := range m.daemons {
		if k.ns != "" {
			seen[Tenant{GPU: k.gpu, Namespace: k.ns}] = true
		}
	}
	m.mu.Unlock()
	if gpus, err := os.ReadDir(m.cfg.Root); err == nil {
		for _, g := range gpus {
			if !g.IsDir() {
				continue
			}
			for _, ns := range m.tenantsOf(g.Name()) {
				if _, ok := m.runningPID(key{gpu: g.Name(), ns: ns}); ok {
					seen[Tenant{GPU: g.Name(), Namespace: ns}] = true
				}
			}
		}
	}
	out := slices.Collect(maps.Keys(seen))
	slices.SortFunc(out, func(a, b Tenant) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Namespace, b.Namespace))
	})
	return out
}

// tenantsOf lists the namespaces with a directory on the GPU, running or not, sorted.
func (m *Manager) tenantsOf(uuid string) []string {
	entries, err := os.ReadDir(hostpath.MPSTenantsDir(m.cfg.Root, uuid))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && len(validation.IsDNS1123Label(e.Name())) == 0 {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}
