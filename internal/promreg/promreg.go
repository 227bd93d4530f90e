// Package promreg registers a collector once per registry: the agent builds its collectors for every
// node it serves in one process (the simulated nodes of the demo, tests that start the agent twice), and
// a second registration must share the first collector, not fail.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it; where reg already holds a collector of c's type under
// the same descriptors, that one is returned instead. A nil reg registers nothing.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		var zero T
		return zero, err
	}
	return c, nil
}
