package scheduler

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/test/wait"
)

// Clients lists a GPU's connected clients with their pids, and none once they left; a GPU the scheduler
// does not serve has none.
func TestClientsListsAGPUsConnectedClientsByPid(t *testing.T) {
	e := newEnv(t, time.Second, time.Second)
	c := dialRaw(t, e.sock, ClassOpportunistic)
	got := e.s.Clients("GPU-test")
	if len(got) != 1 || got[0].PID != int32(os.Getpid()) || got[0].GPU != "GPU-test" {
		t.Fatalf("Clients(GPU-test) = %+v, want this process", got)
	}
	if other := e.s.Clients("GPU-other"); other != nil {
		t.Errorf("Clients of a GPU not served = %+v", other)
	}
	_ = c.conn.Close()
	wait.UntilState(t, 5*time.Second, func() (bool, string) {
		n := len(e.s.Clients("GPU-test"))
		return n == 0, fmt.Sprintf("%d clients left", n)
	}, "the client gone from Clients")
}
