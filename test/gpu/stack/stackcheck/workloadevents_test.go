package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Events are whole lines: a last line still being written is left for the next read, and a line that is
// no event is an error rather than skipped.
func TestParseEventsReadsWholeLinesOnly(t *testing.T) {
	got, err := parseEvents("{\"event\": \"ready\", \"t\": 1700000000.25, \"total\": 8589934592, \"sms\": 32}\n\n{\"event\": \"progress\", \"steps\": 3, \"t\": 1700000001.5}\n{\"event\": \"fil")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Event != "ready" || got[0].Total != 8<<30 || got[0].SMs != 32 || got[1].Steps != 3 {
		t.Fatalf("events %+v", got)
	}
	if at := got[0].at(); !at.Equal(time.Unix(1700000000, 250_000_000)) {
		t.Errorf("at = %v", at)
	}
	if _, err := parseEvents("Traceback (most recent call last):\n"); err == nil {
		t.Error("a line that is no event: no error")
	}
}

// lastEvent is the latest event of its kind at or before a time: what the other workload had done when
// one was told to fill its memory.
func TestLastEventIsTheLatestOfItsKindBeforeATime(t *testing.T) {
	out := filepath.Join(t.TempDir(), "w.out")
	data := "{\"event\": \"progress\", \"steps\": 10, \"t\": 100}\n{\"event\": \"filled\", \"t\": 101}\n{\"event\": \"progress\", \"steps\": 20, \"t\": 102}\n{\"event\": \"progress\", \"steps\": 30, \"t\": 104}\n"
	if err := os.WriteFile(out, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &container{out: out}
	if e, ok := c.lastEvent("progress", time.Unix(103, 0)); !ok || e.Steps != 20 {
		t.Errorf("lastEvent before 103 = %+v, %v; want steps 20", e, ok)
	}
	if _, ok := c.lastEvent("progress", time.Unix(99, 0)); ok {
		t.Error("an event before any: found one")
	}
}

// --scenarios picks scenarios by name; all (or nothing) runs every one but rightsizing, which runs only
// when named, and an unknown name is refused.
func TestParseScenarios(t *testing.T) {
	all, err := parseScenarios("all")
	if o := (options{scenarios: all}); err != nil || !o.wants("sized") || !o.wants("mps") || o.wants("rightsizing") {
		t.Fatalf("all: %v %v", all, err)
	}
	named, err := parseScenarios("rightsizing")
	if o := (options{scenarios: named}); err != nil || !o.wants("rightsizing") || o.wants("sized") {
		t.Fatalf("rightsizing: %v %v", named, err)
	}
	only, err := parseScenarios("sized, usage")
	if o := (options{scenarios: only}); err != nil || !o.wants("sized") || !o.wants("usage") || o.wants("mps") || o.wants("oversubscription") {
		t.Fatalf("sized, usage: %v %v", only, err)
	}
	if _, err := parseScenarios("sized,mig"); err == nil {
		t.Fatal("an unknown scenario: no error")
	}
}
