// Package v1alpha1 holds the gpusharing.io/v1alpha1 API: GPUSharingPolicy (what an admin declares) and
// GPUNode (per node: the controller's resolved desired state in spec, the agent's observations in status).
// +kubebuilder:object:generate=true
// +groupName=gpusharing.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "gpusharing.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
