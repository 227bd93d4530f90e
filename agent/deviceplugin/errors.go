package deviceplugin

import "errors"

var (
	// ErrUnknownDevice is returned when the kubelet allocates a device this resource does not advertise
	// (for example one cordoned a moment ago).
	ErrUnknownDevice = errors.New("device not advertised")
	// ErrCordonedDevice is returned when the kubelet allocates a device of a GPU being drained, which is
	// advertised only while the pod that held it runs.
	ErrCordonedDevice = errors.New("device of a GPU cordoned for a drain")
)
