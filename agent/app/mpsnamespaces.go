package app

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"

	"github.com/gpusharing/gpusharing/agent/deviceplugin"
	"github.com/gpusharing/gpusharing/agent/podres"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// ReasonMPSNamespacesShareADaemon is the reason of the warning event on the node's GPUNode when the
// device plugin's MPS shares of one GPU are held by pods of two or more namespaces: they all connect to
// the GPU's one MPS daemon and share its pipe directory and its /dev/shm, so each can reach the others'
// shared memory and sockets (docs/mps.md). What to do: ask for MPS shares through DRA (ResourceClaims of
// the DeviceClass gpusharing-mps), where each namespace gets a daemon of its own on the GPU, or keep each
// namespace to GPUs of its own (a policy's node selector, or a node per team).
const ReasonMPSNamespacesShareADaemon = "MPSNamespacesShareADaemon"

// mpsNamespacesInterval is how often the device plugin's MPS shares are looked at.
const mpsNamespacesInterval = 30 * time.Second

// mpsNamespaces names the GPUs whose device plugin MPS shares (the GPU's own daemon: Allocate does not
// know which pod, so which namespace, a device goes to) are held by pods of several namespaces. It reads
// the kubelet's PodResources, which maps devices to pods, and reports a GPU once when it becomes shared
// by another set of namespaces.
type mpsNamespaces struct {
	lister   deviceplugin.PodResourcesLister
	resource share.ResourceName
	events   events.EventRecorder
	node     string
	log      logr.Logger
	// reported is, per GPU shared across namespaces, the namespaces last reported.
	reported map[string]string
}

// check lists the pods' devices once and reports each GPU whose set of sharing namespaces changed.
func (w *mpsNamespaces) check(ctx context.Context) error {
	resp, err := w.lister.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return err
	}
	next := map[string]string{}
	for gpu, namespaces := range mpsNamespacesByGPU(resp, w.resource) {
		if len(namespaces) < 2 {
			continue
		}
		list := strings.Join(namespaces, ", ")
		next[gpu] = list
		if w.reported[gpu] == list {
			continue
		}
		w.log.Info("MPS shares of one GPU's daemon are held by pods of several namespaces", "gpu", gpu, "namespaces", list)
		if w.events != nil {
			obj := &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: w.node}}
			w.events.Eventf(obj, nil, corev1.EventTypeWarning, ReasonMPSNamespacesShareADaemon, "CheckMPSTenants",
				"GPU %s: device plugin MPS shares are held by pods of namespaces %s, which share the GPU's one MPS daemon, "+
					"its pipe directory and its /dev/shm; DRA claims get a daemon per namespace", gpu, list)
		}
	}
	w.reported = next
	return nil
}

// run checks every interval until ctx ends; a failed list is logged and tried again.
func (w *mpsNamespaces) run(ctx context.Context, clk clock.WithTicker) error {
	t := clk.NewTicker(mpsNamespacesInterval)
	defer t.Stop()
	for {
		if err := w.check(ctx); err != nil && ctx.Err() == nil {
			w.log.Error(err, "Cannot list the kubelet's pod resources to check the MPS GPUs' namespaces")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// mpsNamespacesByGPU lists, per GPU, the sorted namespaces of the pods holding its MPS resource.
func mpsNamespacesByGPU(resp *podresourcesv1.ListPodResourcesResponse, resource share.ResourceName) map[string][]string {
	out := map[string][]string{}
	for d := range podres.Devices(resp) {
		if d.Resource != string(resource) {
			continue
		}
		gpu := share.GPUOfDeviceID(d.ID)
		if !slices.Contains(out[gpu], d.Namespace) {
			out[gpu] = append(out[gpu], d.Namespace)
		}
	}
	for _, ns := range out {
		slices.Sort(ns)
	}
	return out
}
