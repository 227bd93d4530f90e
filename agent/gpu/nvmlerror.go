package gpu

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLError is a failed NVML call. Its Return keeps NVML's code for errors.As, its message NVML's text.
type NVMLError struct {
	Op     string
	Return nvml.Return
}

func (e *NVMLError) Error() string { return fmt.Sprintf("%s: %s", e.Op, e.Return.Error()) }

// Is lets errors.Is(err, nvml.ERROR_NOT_SUPPORTED) match.
func (e *NVMLError) Is(target error) bool {
	r, ok := target.(nvml.Return)
	return ok && r == e.Return
}

// check turns an nvml.Return into an error. nvml.SUCCESS is itself a non-nil error value, so every
// NVML result goes through here and nothing compares Returns against nil.
func check(op string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Op: op, Return: r}
}

// IsNVMLError reports whether err came from an NVML call.
func IsNVMLError(err error) bool {
	var e *NVMLError
	return errors.As(err, &e)
}

// notSupported reports whether err is NVML saying the GPU lacks the feature (rather than failing), or
// the driver's library lacking the function for it.
func notSupported(err error) bool {
	return errors.Is(err, nvml.ERROR_NOT_SUPPORTED) || errors.Is(err, nvml.ERROR_FUNCTION_NOT_FOUND)
}
