package scheduler

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpusharing/gpusharing/test/wait"
)

// A pod lookup that fails at the hello (a slow API server, a pod newer than the agent's view) makes
// the client opportunistic only until its pod is found: it is looked up again, with back-off, and
// takes its pod's class in place, with the terms of that class (production: no bound).
func TestUnknownPodIsLookedUpAgainAndTheClientReclassified(t *testing.T) {
	threshold := int32(1000)
	var lookups atomic.Int32
	s, sock, _ := startGuarded(t, GPUConfig{ProductionPriority: &threshold}, Guards{PodPriority: func(int32) (int32, bool) {
		switch lookups.Add(1) {
		case 1: // the first client's pod: opportunistic
			return 500, true
		case 2, 3: // the second's hello and its first retry: not found yet
			return 0, false
		}
		return 2000, true
	}})
	opp := dialRaw(t, sock, ClassOpportunistic) // found: opportunistic, paced once production connects
	prod := dialRaw(t, sock, ClassOpportunistic)
	if snap := s.Snapshot(); snap[1].Class != ClassOpportunistic {
		t.Fatalf("a client whose pod lookup failed is %s", snap[1].Class.String())
	}
	wait.Until(t, 10*time.Second, func() bool { return s.Snapshot()[1].Class == ClassProduction },
		"the client whose pod appeared late becomes production")
	if n := lookups.Load(); n != 4 {
		t.Errorf("%d lookups, want 4 (the first client's; the second's hello, a failed retry, the one that found it)", n)
	}
	prod.hold() // busy production: the opportunistic client is paced
	if _, ok := prod.next(MsgPace, 100*time.Millisecond); ok {
		t.Error("the client that became production was paced")
	}
	if p := opp.expect(MsgPace, 2*time.Second); p.MaxQueued != DefaultOpportunisticQueue {
		t.Errorf("the opportunistic client got PACE %d once production took the GPU, want %d", p.MaxQueued, DefaultOpportunisticQueue)
	}
}

// Where the kernel gives no peer pid, the pid the hello reports never chooses the pod: the client is
// of unknown pod, opportunistic, and no lookup is made for that pid (it could name a production pod).
func TestHelloPIDNeverChoosesThePod(t *testing.T) {
	threshold := int32(1000)
	var lookups atomic.Int32
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpu.sock")
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock, ProductionPriority: &threshold}},
		Registerer: prometheus.NewRegistry(), Guards: Guards{PodPriority: func(int32) (int32, bool) {
			lookups.Add(1)
			return 5000, true // every pid is in a production pod
		}}})
	if err != nil {
		t.Fatal(err)
	}
	s.peerPIDOf = func(net.Conn) int32 { return 0 } // a kernel that gives no SO_PEERCRED
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	dialRaw(t, sock, ClassProduction) // its hello names its own pid, in a production pod
	snap := s.Snapshot()
	if len(snap) != 1 || snap[0].Class != ClassOpportunistic || snap[0].PID != int32(os.Getpid()) {
		t.Fatalf("clients = %+v, want one opportunistic client shown with the pid it reported", snap)
	}
	time.Sleep(3 * ReResolveFirst) // no retry either: the absence of a lookup is what is checked
	if n := lookups.Load(); n != 0 {
		t.Errorf("the pod was looked up %d times for a pid the kernel did not give", n)
	}
}

// The pod lookup is retried for as long as the client stays connected, not a fixed number of times: a
// client whose pod the agent cannot see through a long API server outage takes its class once it can.
func TestUnknownPodIsLookedUpAgainForAsLongAsTheClientIsConnected(t *testing.T) {
	threshold := int32(1000)
	const failures = 12 // the hello's lookup and 11 retries: minutes of back-off, past any fixed count
	var lookups atomic.Int32
	clk := newFakeClock()
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpu.sock")
	s, err := New(Options{GPUs: []GPUConfig{{UUID: "GPU-test", SocketPath: sock, ProductionPriority: &threshold}},
		Registerer: prometheus.NewRegistry(), Clock: clk, Guards: Guards{PodPriority: func(int32) (int32, bool) {
			if lookups.Add(1) <= failures {
				return 0, false
			}
			return 2000, true
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	dialRaw(t, sock, ClassOpportunistic)
	// Each look moves the clock past the longest back-off, so every pending retry comes due.
	wait.Until(t, 30*time.Second, func() bool {
		if s.Snapshot()[0].Class == ClassProduction {
			return true
		}
		clk.Advance(ReResolveMax)
		return false
	}, "the client whose pod was found after a long outage becomes production")
	if n := lookups.Load(); n != failures+1 {
		t.Errorf("%d lookups, want %d (every failed one, then the one that found the pod)", n, failures+1)
	}
}
