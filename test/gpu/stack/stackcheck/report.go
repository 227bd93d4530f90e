package main

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// report prints one line per check and keeps the counts and the measured times for the summary.
type report struct {
	mu       sync.Mutex
	scenario string
	passed   int
	failed   int
	times    []string
	failures []string
}

func (r *report) begin(name string) {
	r.mu.Lock()
	r.scenario = name
	r.mu.Unlock()
	fmt.Printf("\n== %s (%s)\n", name, time.Now().UTC().Format(time.RFC3339))
}

// check records a check: ok, or the detail of why not.
func (r *report) check(name string, ok bool, detailFormat string, args ...any) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	detail := fmt.Sprintf(detailFormat, args...)
	if ok {
		r.passed++
		fmt.Printf("PASS %s: %s\n", name, detail)
	} else {
		r.failed++
		r.failures = append(r.failures, r.scenario+": "+name)
		fmt.Printf("FAIL %s: %s\n", name, detail)
	}
	return ok
}

// must is check for an error: nil passes.
func (r *report) must(name string, err error) bool {
	if err != nil {
		return r.check(name, false, "%v", err)
	}
	return r.check(name, true, "ok")
}

// timed records a measured duration against its target.
func (r *report) timed(name string, d, target time.Duration) bool {
	r.mu.Lock()
	r.times = append(r.times, fmt.Sprintf("%s: %.2fs (target <= %.1fs)", name, d.Seconds(), target.Seconds()))
	r.mu.Unlock()
	return r.check(name, d <= target, "%.2fs (target <= %.1fs)", d.Seconds(), target.Seconds())
}

func (r *report) summary() {
	fmt.Println("\n== summary")
	for _, t := range r.times {
		fmt.Println("time", t)
	}
	for _, f := range r.failures {
		fmt.Println("failed:", f)
	}
	verdict := "PASS"
	if r.failed > 0 {
		verdict = "FAIL"
	}
	fmt.Printf("%s: %d passed, %d failed\n", verdict, r.passed, r.failed)
	fmt.Println(strings.Repeat("-", 40))
}
