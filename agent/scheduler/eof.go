package scheduler

import (
	"errors"
	"io"
	"syscall"
)

// isEOF reports an ordinary end of connection (as opposed to a protocol error).
func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}
