package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/hostpath"
	"github.com/gpusharing/gpusharing/agent/scheduler"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/fakekubelet"
	"github.com/gpusharing/gpusharing/test/shimclient"
	"github.com/gpusharing/gpusharing/test/wait"
)

// stopAs makes this test process, every shim client of these tests, look stopped (SIGSTOP) to the agent
// through its thread's stat file under procRoot.
func stopAs(t *testing.T, procRoot string) {
	t.Helper()
	pid := fmt.Sprint(os.Getpid())
	dir := filepath.Join(procRoot, pid, "task", pid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(pid+" (app.test) T 1 1 1 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A pod's process that holds a GPU's lock and is stopped while another waits loses the lock within the
// stall bound, its quantum a minute, and its pod gets a warning event that says why.
func TestAStoppedHoldersPodHearsWhyItLostTheLock(t *testing.T) {
	procRoot := t.TempDir()
	n := startNodeWith(t, 1, func(o *Options) { o.ProcRoot = procRoot })
	uuid := n.uuid(0)
	sharing := oversubscribedTimeSlicing(2, time.Minute, "8Gi")
	sharing.Oversubscription.AntiThrashing = v1alpha1.AntiThrashingAlways // one holder at a time
	n.setSpec(t, v1alpha1.GPUDesired{UUID: uuid, Index: 0, Sharing: sharing})
	n.waitFor(t, "GPU 0 time-sliced with oversubscription", appliedAsDesired(uuid))
	sock := hostpath.SchedulerSocket(filepath.Join(n.dir, "s"), uuid)
	holder := guardPod(t, "stopped-"+n.name, n.name)
	n.pods.SetPods(fakekubelet.Pod("default", holder.Name, "gpusharing.io/gpu-shared", share.ReplicaID(uuid, 0)))
	runAs(t, procRoot, holder)

	a := shimclient.Dial(t, sock, uuid)
	a.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	a.Until(scheduler.MsgGrant)
	b := shimclient.Dial(t, sock, uuid)
	b.Send(scheduler.Message{Type: scheduler.MsgAcquire})
	n.waitFor(t, "one client holding, one waiting", shimClients(uuid, time.Minute, 2, 1))

	stopAs(t, procRoot)
	stopped := time.Now()
	b.Until(scheduler.MsgGrant)
	t.Logf("the waiter was granted %s after the holder looked stopped", time.Since(stopped).Round(10*time.Millisecond))
	a.Until(scheduler.MsgRevoked)
	wait.UntilState(t, 30*time.Second, func() (bool, string) {
		got := eventsAbout(t, "Pod", holder.Name, ReasonStoppedWhileHolding)
		return len(got) == 1 && strings.HasPrefix(got[0], "Warning: ") && strings.Contains(got[0], "GPU "+uuid+" on "+n.name) &&
			strings.Contains(got[0], "was stopped or frozen for"), fmt.Sprintf("events on the pod: %q", got)
	}, "a warning event on the stopped holder's pod")
}
