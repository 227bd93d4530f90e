package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"
)

// workloadEvent is one line test/gpu/stack/sized_workload.py prints (its docstring lists them).
type workloadEvent struct {
	Event string  `json:"event"`
	T     float64 `json:"t"`
	// ready
	PID   int   `json:"pid"`
	Total int64 `json:"total"`
	Free  int64 `json:"free"`
	SMs   int   `json:"sms"`
	// progress, done
	Steps int `json:"steps"`
	Bad   int `json:"bad"`
	// filled, held
	GiB     float64 `json:"gib"`
	OOM     bool    `json:"oom"`
	Error   string  `json:"error"`
	AfterOK bool    `json:"after_ok"`
	// full (also Free, Total, Error): the bytes allocated
	Bytes int64 `json:"bytes"`
}

// at is when the workload says the event happened (its clock is this machine's).
func (e workloadEvent) at() time.Time {
	sec, frac := math.Modf(e.T)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// parseEvents reads a workload's output: one JSON object per line; a last line still being written is
// left for the next read.
func parseEvents(out string) ([]workloadEvent, error) {
	var events []workloadEvent
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if i == len(lines)-1 || strings.TrimSpace(line) == "" {
			continue // not ended by a newline yet, or empty
		}
		var e workloadEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return events, fmt.Errorf("line %d %q: %w", i+1, line, err)
		}
		events = append(events, e)
	}
	return events, nil
}

// events are the workload's events so far.
func (c *container) events() ([]workloadEvent, error) {
	data, err := os.ReadFile(c.out)
	if err != nil {
		return nil, err
	}
	return parseEvents(string(data))
}

// waitEvent waits until the workload has printed an event that match accepts, and returns the first.
// A workload that exits first, or prints what is not an event, fails the wait.
func (c *container) waitEvent(ctx context.Context, timeout time.Duration, what string, match func(workloadEvent) bool) (workloadEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	find := func() (workloadEvent, bool, error) {
		events, err := c.events()
		for _, e := range events {
			if match(e) {
				return e, true, nil
			}
		}
		return workloadEvent{}, false, err
	}
	for {
		if e, ok, err := find(); ok || err != nil {
			return e, err
		}
		select {
		case <-c.done:
			// It may have printed the event and exited since the read above.
			if e, ok, err := find(); ok || err != nil {
				return e, err
			}
			stderr, _ := os.ReadFile(c.errf)
			return workloadEvent{}, fmt.Errorf("exited (%v) before %s: %s", c.err, what, tail(string(stderr), 600))
		case <-ctx.Done():
			return workloadEvent{}, fmt.Errorf("no %s within %s", what, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// lastEvent is the latest event of kind at or before t (ok false where there is none).
func (c *container) lastEvent(kind string, t time.Time) (workloadEvent, bool) {
	events, _ := c.events()
	var last workloadEvent
	ok := false
	for _, e := range events {
		if e.Event == kind && !e.at().After(t) {
			last, ok = e, true
		}
	}
	return last, ok
}

// command writes one command line to the workload's stdin.
func (c *container) command(cmd string) error {
	_, err := io.WriteString(c.stdin, cmd+"\n")
	return err
}

// running says whether the workload has not exited.
func (c *container) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}
