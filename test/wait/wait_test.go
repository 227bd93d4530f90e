package wait

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of ending the goroutine's test.
type recorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.msg = fmt.Sprintf(format, args...)
	r.mu.Unlock()
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	Until(t, time.Minute, func() bool { n++; return n == 3 }, "the third poll")
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
}

func TestForFailsWithWhatItWaitedForAndTheLastObservedState(t *testing.T) {
	r := &recorder{TB: t}
	n := 0
	For(r, 50*time.Millisecond, func() error { n++; return fmt.Errorf("phase is Pending (poll %d)", n) }, "pod %s runs", "p1")
	for _, want := range []string{"timed out after 50ms", "pod p1 runs", fmt.Sprintf("phase is Pending (poll %d)", n)} {
		if !strings.Contains(r.msg, want) {
			t.Errorf("failure message %q lacks %q", r.msg, want)
		}
	}
}

func TestUntilStateNamesTheLastState(t *testing.T) {
	r := &recorder{TB: t}
	UntilState(r, 20*time.Millisecond, func() (bool, string) { return false, "3 of 4 ready" }, "all ready")
	if !strings.Contains(r.msg, "last observed: 3 of 4 ready") {
		t.Errorf("failure message %q lacks the last state", r.msg)
	}
}

func TestPollChecksOnceMoreAtTheDeadline(t *testing.T) {
	calls := 0
	err := Poll(0, func() error { calls++; return errors.New("no") })
	if err == nil || calls != 1 {
		t.Fatalf("Poll(0) = %v after %d calls, want an error after one", err, calls)
	}
}
