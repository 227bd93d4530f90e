package dra_test

import (
	"reflect"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
)

func class(name, resource, expr string) resourcev1.DeviceClass {
	c := resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if resource != "" {
		c.Spec.ExtendedResourceName = &resource
	}
	if expr != "" {
		c.Spec.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expr}}}
	}
	return c
}

func TestServedByDRACountsOnlyTheClassesOfThisDriver(t *testing.T) {
	ours := `device.driver == "gpu.gpusharing.io" && device.attributes["gpu.gpusharing.io"].share == "TimeSlicing"`
	for _, tc := range []struct {
		name    string
		classes []resourcev1.DeviceClass
		want    map[share.ResourceName]bool
	}{
		{"no classes", nil, map[share.ResourceName]bool{}},
		{"a class of this driver naming a resource", []resourcev1.DeviceClass{class("ts", "gpusharing.io/gpu-timeslice", ours)},
			map[share.ResourceName]bool{"gpusharing.io/gpu-timeslice": true}},
		{"a class of this driver naming none (sized, dynamic MIG, or the gate off)", []resourcev1.DeviceClass{class("sized", "", ours)},
			map[share.ResourceName]bool{}},
		{"another driver's class naming nvidia.com/gpu", []resourcev1.DeviceClass{class("other", "nvidia.com/gpu", `device.driver == "gpu.nvidia.com"`)},
			map[share.ResourceName]bool{}},
		{"a class without selectors", []resourcev1.DeviceClass{class("any", "nvidia.com/gpu", "")}, map[share.ResourceName]bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dra.ServedByDRA(tc.classes); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ServedByDRA = %v, want %v", got, tc.want)
			}
		})
	}
}
