package scheduler

import (
	"errors"
	"fmt"
)

// clientState is where one client stands with the GPU lock. It is a single value so that a client
// cannot be half in two places (waiting and holding, filling without a grant): every move goes
// through setStateLocked, which takes only the moves in clientTransitions.
type clientState uint8

const (
	// stateIdle: connected, neither waiting nor granted (also between two holds).
	stateIdle clientState = iota
	// stateWaiting: in line for the GPU (queue.waiting), with the need it asked for.
	stateWaiting
	// stateFilling: granted before its whole need was free, because evictions under way cover the
	// rest; its reservation rises as they free bytes (Raise, fill.go) and it swaps in meanwhile.
	// Freed budget goes to it before anyone else is granted.
	stateFilling
	// stateStarting: granted with its whole need reserved, swapping its memory in; its quantum (and a
	// revocation armed meanwhile) counts from the grant until its first report, then from that report.
	stateStarting
	// stateRunning: granted with its memory in, or with nothing to swap in (no budget, need 0); its
	// quantum counts.
	stateRunning
	// stateGone: it left (its connection ended, or the scheduler dropped it); whatever it still sends
	// before its reader notices is ignored.
	stateGone

	numClientStates
)

var clientStateNames = [numClientStates]string{"idle", "waiting", "filling", "starting", "running", "gone"}

func (s clientState) String() string {
	if s < numClientStates {
		return clientStateNames[s]
	}
	return fmt.Sprintf("clientState(%d)", uint8(s))
}

// granted: the client holds the GPU (it is in queue.holders), whether or not its memory is in yet.
func (s clientState) granted() bool {
	return s == stateFilling || s == stateStarting || s == stateRunning
}

// clientTransitions is every move a client's state may make, with what makes it.
var clientTransitions = []struct {
	from, to clientState
	why      string
}{
	{stateIdle, stateWaiting, "Acquire"},
	{stateWaiting, stateRunning, "granted without a budget, or with nothing to swap in"},
	{stateWaiting, stateStarting, "granted with its whole need reserved"},
	{stateWaiting, stateFilling, "granted part of its need while evictions free the rest"},
	{stateFilling, stateStarting, "its reservation reached its need"},
	{stateStarting, stateRunning, "its first report since the grant: its memory is in"},
	{stateFilling, stateIdle, "Release, revoked, or preempted by production (qos.go)"},
	{stateStarting, stateIdle, "Release, revoked, or preempted by production (qos.go)"},
	{stateRunning, stateIdle, "Release, revoked, or preempted by production (qos.go)"},
	{stateIdle, stateGone, "left"},
	{stateWaiting, stateGone, "left while waiting"},
}

// legalTransition is clientTransitions as a lookup table.
var legalTransition = func() (t [numClientStates][numClientStates]bool) {
	for _, tr := range clientTransitions {
		t[tr.from][tr.to] = true
	}
	return t
}()

// errIllegalTransition is a move not in clientTransitions: a scheduler bug, never a client's doing
// (every entry point checks what a client asks for against its state before it moves it).
var errIllegalTransition = errors.New("illegal client state transition")

// transition checks one move against clientTransitions.
func transition(from, to clientState) error {
	if from >= numClientStates || to >= numClientStates || !legalTransition[from][to] {
		return fmt.Errorf("%w: %v -> %v", errIllegalTransition, from, to)
	}
	return nil
}

// setStateLocked moves c to state to and keeps the waiting and holder lists in step with it: a client
// is in queue.waiting exactly while it waits, in queue.holders exactly while it is granted. A move
// not in clientTransitions is refused: c keeps its state, the error is logged and counted
// (violationLocked), and c is dropped, so that its connection's end takes it out of the queue by
// the one move that is always legal (leave) instead of a GPU stuck on a client in a state nobody
// can move it out of. The agent never panics for it.
func (q *queue) setStateLocked(c *client, to clientState) error {
	from := c.state
	if err := transition(from, to); err != nil {
		q.violationLocked(fmt.Errorf("client %d: %w", c.id, err))
		c.drop()
		return err
	}
	if from == stateWaiting {
		w := q.waiting[c.class]
		for i := range w {
			if w[i] == c {
				q.waiting[c.class] = append(w[:i:i], w[i+1:]...)
				break
			}
		}
	}
	if from.granted() && !to.granted() {
		for i, h := range q.holders {
			if h == c {
				q.holders = append(q.holders[:i:i], q.holders[i+1:]...)
				break
			}
		}
		if len(q.holders) == 0 {
			q.freedAt = q.clock.Now()
		}
	}
	c.state = to
	if to == stateWaiting {
		q.waiting[c.class] = append(q.waiting[c.class], c)
	}
	if to.granted() && !from.granted() {
		q.holders = append(q.holders, c)
	}
	return nil
}

// violationLocked records a broken invariant of the queue (a transition not in the table, a change
// of a reservation against the budget rule). Each is a scheduler bug: it is logged as an error and
// kept for tests, which fail on any.
func (q *queue) violationLocked(err error) {
	q.violations = append(q.violations[:min(len(q.violations), maxViolationsKept-1)], err)
	q.log.Error(err, "Scheduler invariant broken")
}

// maxViolationsKept bounds the memory a scheduler bug that repeats can take.
const maxViolationsKept = 16

// checkBudget is the budget rule, the one rule of a GPU's memory account. It judges one change of a
// client's reservation from `from` to `to` bytes, where reserved is the GPU's sum of reservations
// before the change and need the client's need:
//
// A reservation falls freely. It rises only out of the free budget (the sum after the rise is
// within the budget) and only as far as its client's need. So once the sum is within the budget it
// stays there, and a sum above the budget only falls until it is back within it (nothing is raised
// meanwhile, and evictions free the excess too: overLocked).
//
// The one exception is a Rejoin (rebuild.go): the memory a reconnected client re-announces is
// resident already, so it is accounted, from nothing, up to the budget, whether or not it fits
// beside the others. The sum is above the budget only after such Rejoins, or after Reconfigure
// lowered the budget below it (it revokes no reservation). Without a budget nothing is reserved.
func checkBudget(budget, reserved, from, to, need uint64, rejoin bool) error {
	switch {
	case to <= from:
		return nil
	case budget == 0:
		return fmt.Errorf("reservation raised to %d on a GPU without a budget", to)
	case rejoin:
		if from != 0 || to > budget {
			return fmt.Errorf("re-announced reservation %d -> %d (budget %d)", from, to, budget)
		}
		return nil
	case to > need:
		return fmt.Errorf("reservation raised %d -> %d beyond its need %d", from, to, need)
	case reserved-from+to > budget:
		return fmt.Errorf("reservation raised %d -> %d takes the reserved sum from %d to %d, above the budget %d",
			from, to, reserved, reserved-from+to, budget)
	}
	return nil
}

// clientInvariantLocked says whether c's fields agree with its state. Besides the state, a client
// keeps three flags, each about something else than the lock and each legal in several states:
//   - evictPending (an EVICT awaits its answer) is about its memory, in idle or waiting: EVICT goes
//     only to clients that do not hold, and a waiter whose eviction is outstanding is not granted.
//   - memPending (a MemReq awaits its answer) is a granted client's, in any of the three granted
//     states; the end of its hold answers it.
//   - contendedSent (this hold's holder was told someone waits) belongs to the hold, cleared at the
//     grant and at its end.
//
// rejoined (it sent its Rejoin, once per connection) holds in every state. A connected client's
// class also agrees with the GPU (qosInvariantLocked): it is what its pod and the threshold make it,
// it is not an opportunistic holder while a production client waits or holds, it was not asked to
// evict production memory for an opportunistic client, and it runs under the PACE it should.
func (q *queue) clientInvariantLocked(c *client) error {
	s := c.state
	_, connected := q.clients[c.id]
	switch {
	case s >= numClientStates:
		return fmt.Errorf("client %d in unknown state %v", c.id, s)
	case connected == (s == stateGone):
		return fmt.Errorf("client %d %v, connected=%v", c.id, s, connected)
	case c.evictPending && s != stateIdle && s != stateWaiting:
		return fmt.Errorf("client %d %v with an EVICT outstanding", c.id, s)
	case c.memPending && !s.granted():
		return fmt.Errorf("client %d %v with a MemReq outstanding", c.id, s)
	case c.contendedSent && !s.granted():
		return fmt.Errorf("client %d %v was told of contention", c.id, s)
	case c.revokeTimer != nil && !s.granted():
		return fmt.Errorf("client %d %v with a revocation armed", c.id, s)
	case s == stateFilling && (q.budget == 0 || c.reservation >= c.need || !c.fillsPartially()):
		return fmt.Errorf("client %d (version %d) filling with reservation %d, need %d, budget %d", c.id, c.version,
			c.reservation, c.need, q.budget)
	case s == stateGone && (c.reservation != 0 || c.evictPending):
		return fmt.Errorf("client %d gone with reservation %d, evictPending=%v", c.id, c.reservation, c.evictPending)
	case s != stateGone:
		return q.qosInvariantLocked(c)
	}
	return nil
}
