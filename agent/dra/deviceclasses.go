package dra

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/gpusharing/gpusharing/agent/share"
)

// The agent reads the DeviceClasses to learn which extended resources DRA serves, so its device plugin
// leaves them alone where both run.
// +kubebuilder:rbac:groups=resource.k8s.io,resources=deviceclasses,verbs=list;watch

// ServedByDRA are the extended resource names DeviceClasses map to this driver's devices
// (spec.extendedResourceName, KEP-5004): a class maps a name to gpusharing's devices when one of its CEL
// selectors names the driver (`device.driver == "gpu.gpusharing.io"`, as config/dra's classes do). A
// class of another driver that names, say, nvidia.com/gpu does not count: its pods would get that
// driver's devices, and gpusharing's device plugin advertising the name does no harm to them. The API
// server drops extendedResourceName where its DRAExtendedResource gate is off, so there no name is served
// by DRA and the device plugin advertises every name.
func ServedByDRA(classes []resourcev1.DeviceClass) map[share.ResourceName]bool {
	out := map[share.ResourceName]bool{}
	for _, c := range classes {
		if c.Spec.ExtendedResourceName == nil || *c.Spec.ExtendedResourceName == "" || !selectsDriver(c) {
			continue
		}
		out[share.ResourceName(*c.Spec.ExtendedResourceName)] = true
	}
	return out
}

// driverLiteral is the driver's name as a CEL string literal.
var driverLiteral = strconv.Quote(DriverName)

func selectsDriver(c resourcev1.DeviceClass) bool {
	for _, s := range c.Spec.Selectors {
		if s.CEL != nil && strings.Contains(s.CEL.Expression, driverLiteral) {
			return true
		}
	}
	return false
}

// DeviceClassTarget is told the names DRA serves: the device plugin's manager.
type DeviceClassTarget interface {
	SetServedByDRA(ctx context.Context, names map[share.ResourceName]bool) error
}

// DeviceClassWatch keeps a DeviceClassTarget told which extended resources the cluster's DeviceClasses
// serve through DRA. Every class event leads to one pass over all classes (they are few), and a first
// pass runs at start, classes or none, so the target learns the set once before anything else.
type DeviceClassWatch struct {
	Reader client.Reader
	Target DeviceClassTarget
	// SkipNameValidation lets several agents of one process (the demo, tests) register the controller.
	SkipNameValidation bool
}

// deviceClassesKey is the one request every class event becomes.
var deviceClassesKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "deviceclasses"}}

// Reconcile lists the DeviceClasses and hands the target the names they serve.
func (w *DeviceClassWatch) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var list resourcev1.DeviceClassList
	if err := w.Reader.List(ctx, &list); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing DeviceClasses: %w", err)
	}
	return reconcile.Result{}, w.Target.SetServedByDRA(ctx, ServedByDRA(list.Items))
}

// SetupWithManager watches the DeviceClasses through the manager's cache.
func (w *DeviceClassWatch) SetupWithManager(mgr manager.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{deviceClassesKey}
	})
	kick := make(chan event.GenericEvent, 1)
	kick <- event.GenericEvent{Object: &resourcev1.DeviceClass{}}
	return builder.ControllerManagedBy(mgr).
		Named("deviceclasses-agent").
		WithOptions(controller.Options{SkipNameValidation: &w.SkipNameValidation}).
		Watches(&resourcev1.DeviceClass{}, one).
		WatchesRawSource(source.Channel(kick, one)).
		Complete(w)
}
