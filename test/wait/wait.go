// Package wait is the one polling helper of the test suites: a test waits for the state it checks (an
// object's status, a log line, a counter, a message handled), never for a fixed time.
//
// Every function polls its condition every Interval until it holds or the timeout passes; then it fails
// the test with what it waited for and the last state it observed, so a timeout says how far the system
// got. A test that checks that something did NOT happen first waits for the event that proves the system
// looked (a reconcile counted, a message handled, a log line) and then checks that nothing changed.
package wait

import (
	"fmt"
	"testing"
	"time"
)

// Interval is how often the conditions are polled: short next to every timeout in the suites, long
// enough that polling an API server or a file costs little.
const Interval = 10 * time.Millisecond

// Until waits until cond returns true. what (formatted with args) names the state waited for.
func Until(t testing.TB, timeout time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	For(t, timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}, what, args...)
}

// UntilState waits until cond returns true; the string it returns describes what it observed, and the
// last one is in the failure message.
func UntilState(t testing.TB, timeout time.Duration, cond func() (bool, string), what string, args ...any) {
	t.Helper()
	For(t, timeout, func() error {
		ok, state := cond()
		if ok {
			return nil
		}
		return stateError(state)
	}, what, args...)
}

// UntilOK waits until cond returns true; the error it returns, when not nil, describes what it observed
// (a failed read, the state so far), and the last one is in the failure message.
func UntilOK(t testing.TB, timeout time.Duration, cond func() (bool, error), what string, args ...any) {
	t.Helper()
	For(t, timeout, func() error {
		ok, err := cond()
		switch {
		case ok:
			return nil
		case err != nil:
			return err
		default:
			return errNotYet
		}
	}, what, args...)
}

// For waits until cond returns nil; the error it returns describes what it observed (the last one is in
// the failure message).
func For(t testing.TB, timeout time.Duration, cond func() error, what string, args ...any) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("timed out after %v waiting until %s: %v", timeout, fmt.Sprintf(what, args...), err)
	}
}

// Poll is For without a test: it returns nil once cond returned nil, or cond's last error after timeout.
// For code that runs outside the test's goroutine (where t.Fatal must not be called) and for callers
// that add their own context to the failure.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(Interval)
	}
}

type stateError string

func (s stateError) Error() string {
	if s == "" {
		return "the condition still does not hold"
	}
	return "last observed: " + string(s)
}

var errNotYet = stateError("")
