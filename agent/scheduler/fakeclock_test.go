package scheduler

import (
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// fakeClock moves only when Advance is called; due AfterFunc callbacks run
// synchronously inside Advance, in deadline order, with the clock unlocked (a callback reads Now).
// k8s.io/utils/clock/testing's FakeClock runs callbacks under its lock and not in deadline order, so
// the scheduler's tests keep this one; it implements the same clock.WithDelayedExecution.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
	fired   bool
	ch      chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped && !t.fired
	t.at, t.stopped, t.fired = t.c.now.Add(d), false, false
	return was
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// After, NewTimer, Tick and Sleep complete the interface; the scheduler uses only Now and AfterFunc.
func (c *fakeClock) After(d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

func (c *fakeClock) NewTimer(d time.Duration) clock.Timer {
	ch := make(chan time.Time, 1)
	t := c.AfterFunc(d, func() { ch <- c.Now() })
	t.(*fakeTimer).ch = ch
	return t
}

func (c *fakeClock) Tick(time.Duration) <-chan time.Time {
	panic("fakeClock: Tick is not used by the scheduler")
}

func (c *fakeClock) Sleep(d time.Duration) { c.Advance(d) }

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped && !t.fired
	t.stopped = true
	return was
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.Slice(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.stopped && !t.fired && !t.at.After(target) {
				next = t
				break
			}
		}
		if next == nil {
			c.now = target
			c.mu.Unlock()
			return
		}
		next.fired = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
	}
}
