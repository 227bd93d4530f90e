// Package outcome carries why a GPU is not as desired from the strategy packages (mig, mps, timeslice)
// to the node reconciler, which turns it into a condition reason and message. Sentinel reasons travel as
// an *Error so the reconciler matches them with errors.As, never by string.
package outcome

import (
	"errors"
	"fmt"
)

// Error is a GPU that cannot (yet) run its desired sharing, with the condition reason that says why.
type Error struct {
	// Reason is a v1alpha1 reason constant (GPUBusy, LayoutDoesNotFit, ...).
	Reason string
	// Message is for people: it names the profile, the pids, the command.
	Message string
	// PIDs are the processes that block a disruptive change (GPUBusy).
	PIDs []int32
	// Err is the underlying error, when there is one.
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Message) }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Newf builds an Error with a formatted message.
func Newf(reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// As returns the *Error in err's chain.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// PIDsOrNil returns the pids of a possibly nil *Error, for test and log messages.
func (e *Error) PIDsOrNil() []int32 {
	if e == nil {
		return nil
	}
	return e.PIDs
}
