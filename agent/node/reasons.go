package node

import (
	"errors"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// reasonFor names the condition reason of a failed pass on a GPU.
func reasonFor(err error) (reason, message string) {
	if o, ok := outcome.As(err); ok {
		return o.Reason, o.Message
	}
	var exit *runner.ExitError
	switch {
	case gpu.IsNVMLError(err), errors.Is(err, gpu.ErrUnavailable), errors.Is(err, gpu.ErrNotFound):
		return v1alpha1.ReasonNVMLError, err.Error()
	case errors.As(err, &exit), errors.Is(err, runner.ErrTimeout):
		return v1alpha1.ReasonCommandFailed, err.Error()
	}
	return v1alpha1.ReasonCommandFailed, err.Error()
}

// transient reports whether an error is worth retrying with backoff rather than waiting for a change
// (a layout that does not fit or a busy GPU stays so until the spec or the workload changes).
func transient(err error) bool {
	_, ok := outcome.As(err)
	return err != nil && !ok
}
