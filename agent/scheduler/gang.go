package scheduler

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// Gangs.
//
// A job whose processes wait on each other across GPUs (a collective: NCCL's all-reduce runs one kernel
// per GPU, each spinning until its peers join) cannot make progress while one GPU's lock is held by one
// of its processes and its peer waits for another GPU's. Two such jobs crossing on the same GPUs would
// each hold one GPU and wait for the other until a revocation, a quantum later, at every step. So the
// clients of one owner on two or more of the node's GPUs form a gang, which takes its turn on all its
// GPUs at once:
//
//   - Membership comes from the kernel's view only: the pod of the peer pid (Options.GangKey, the agent
//     names it from the process's cgroup), or, where no pods are named (the standalone scheduler), its
//     session (/proc/<pid>/stat: a job started under setsid). A key whose clients are all on one GPU is
//     no gang: its clients follow the GPU's rules unchanged. A gang forms and dissolves as its clients
//     connect and leave.
//   - A turn starts only when all the gang's GPUs can be given to it at once. A gang that asks (any
//     member waits) takes a ticket; in ticket order, a gang whose GPUs no earlier gang wants and none
//     holds reserves them all at once (claim), each GPU only once the waiters that asked before its
//     ticket were served; a later gang that shares a GPU with it waits behind it. Since reservations
//     are taken whole, in one global order, under one lock, crossing gangs cannot deadlock.
//   - A claimed GPU grants nobody outside the gang; its other holders are told someone waits and are
//     revoked after their quantum and grace, as for any waiter (opportunistic ones are preempted at
//     once by a production gang). When no other holder is left on any of its GPUs the turn starts:
//     each member is granted at once when it asks, no one else is.
//   - The quantum is one clock for all the gang's GPUs, from the turn's start, with the least quantum
//     and grace of its GPUs. When anyone else waits for one of its GPUs (a client in line, or another
//     gang's claim), every member holding is told (CONTENDED) and, past quantum plus grace, all are
//     revoked together and the turn ends.
//   - The turn ends at once when no member holds or waits (each member released after its shim's idle
//     window), when a member leaves (its peers cannot finish a collective without it: their grants
//     are revoked), and for production (below).
//   - Classes: a gang is production when all its members are. A production gang's claim preempts the
//     opportunistic holders of all its GPUs; an opportunistic gang claims only GPUs with no production
//     client waiting or holding, and its turn is preempted (keeping its ticket) when a production client
//     asks for one of them: at once there, after the grace on its other GPUs (gangpreempt.go).
//
// Every queue a Gangs coordinates takes its lock (Gangs.mu): a gang's decisions move clients of several
// GPUs at once. A node's schedulers serialize on it; each of their operations is microseconds.

// GangKey names the owner of a client from its peer pid: clients of one key on several GPUs form a
// gang. "" names none.
type GangKey func(pid int32) string

// Gangs coordinates the gangs of a node's GPUs; the node's Schedulers share one (Options.Gangs).
type Gangs struct {
	mu      sync.Mutex // every coordinated queue's lock
	byKey   map[string]*gang
	owner   map[*queue]*gang // the claimed or running turn each GPU is reserved for
	seq     uint64           // orders the gangs' tickets and the clients' requests
	formed  int              // gangs with members on two or more GPUs
	clock   Clock
	metrics *Metrics

	settling bool
	dirty    []dirtyQueue
}

type dirtyQueue struct {
	q        *queue
	acquirer *client
}

// NewGangs returns a coordinator for Schedulers to share.
func NewGangs() *Gangs {
	return &Gangs{byKey: map[string]*gang{}, owner: map[*queue]*gang{}}
}

// errGangsUnsettled: the gangs' decisions and dispatches did not settle within maxSettlePasses.
var errGangsUnsettled = errors.New("gang decisions did not settle")

type gangState uint8

const (
	gangIdle    gangState = iota // no turn
	gangClaimed                  // its GPUs reserved, waiting for their other holders to go
	gangRunning                  // its turn: each member is granted at once when it asks
)

// gang is the clients of one key.
type gang struct {
	key     string
	members []*client // connected, in join order; each knows its queue (client.gpu)
	state   gangState
	// ticket is its place among the gangs that ask (0: it does not ask); wantSince when it took it.
	ticket    uint64
	wantSince time.Time
	turnStart time.Time
	formedAt  time.Time     // when its members came to span two or more GPUs
	quantum   time.Duration // the least of its GPUs', for the turn in progress
	grace     time.Duration
	contended bool
	revoke    Timer
	// lent are the GPUs of the turn in progress handed back because its members there stayed idle past
	// GangIdleWindow while someone else waited (gangidle.go); lend is the decision armed for the next
	// GPU that may qualify, at lendAt.
	lent   []*queue
	lend   Timer
	lendAt time.Time
	// lingering are the members kept granted, with their epochs, for the grace after a preempted turn
	// (gangpreempt.go); linger revokes them, lingerGen tells its firing from a stopped one's.
	lingering map[*client]uint32
	linger    Timer
	lingerGen uint64
	// turns and waited are its turns and the time it waited for them, for the log line at its end.
	turns  uint64
	waited time.Duration
}

// gpus are the queues of its members, in the order of their first member.
func (g *gang) gpus() []*queue {
	var out []*queue
	for _, c := range g.members {
		if !slices.Contains(out, c.gpu) {
			out = append(out, c.gpu)
		}
	}
	return out
}

// isGang: its members are on two or more GPUs.
func (g *gang) isGang() bool {
	for _, c := range g.members[min(1, len(g.members)):] {
		if c.gpu != g.members[0].gpu {
			return true
		}
	}
	return false
}

// production: every member is.
func (g *gang) production() bool {
	for _, c := range g.members {
		if c.class != ClassProduction {
			return false
		}
	}
	return true
}

// busy: a member waits or holds.
func (g *gang) busy() bool {
	return slices.ContainsFunc(g.members, func(c *client) bool { return c.state == stateWaiting || c.state.granted() })
}

// busyOn: a member on q waits or holds.
func (g *gang) busyOn(q *queue) bool {
	return slices.ContainsFunc(g.members, func(c *client) bool {
		return c.gpu == q && (c.state == stateWaiting || c.state.granted())
	})
}

// gangOf is c's gang when it is one (members on several GPUs), else nil.
func gangOf(c *client) *gang {
	if c.gang != nil && c.gang.isGang() {
		return c.gang
	}
	return nil
}

// active: some gang is formed or reserves a GPU; otherwise every queue dispatches as if alone.
func (co *Gangs) active() bool { return co.formed > 0 || len(co.owner) > 0 }

func (co *Gangs) nextSeqLocked() uint64 {
	co.seq++
	return co.seq
}

// joinLocked makes c, a client of q, a member of key's clients.
func (co *Gangs) joinLocked(c *client, key string) {
	g := co.byKey[key]
	if g == nil {
		g = &gang{key: key}
		co.byKey[key] = g
	}
	was := g.isGang()
	if g.state != gangIdle && !slices.Contains(g.gpus(), c.gpu) {
		// A turn reserves all the gang's GPUs: one joining mid-turn starts the next.
		co.endTurnLocked(g, gangEndMemberJoined)
	}
	c.gang = g
	g.members = append(g.members, c)
	if !was && g.isGang() {
		g.formedAt = co.clock.Now()
		for _, q := range g.gpus() {
			co.markLocked(q, nil) // a member holding there is partial now: told to go if anyone waits
		}
		co.formed++
		c.gpu.log.Info("Gang formed", "gang", key, "gpus", len(g.gpus()))
		co.metrics.gangs.Inc()
	}
}

// leaveLocked forgets c, which left: a turn of its gang ends (its peers' grants revoked), and a gang
// left on one GPU dissolves.
func (co *Gangs) leaveLocked(c *client) {
	g := c.gang
	if g == nil {
		return
	}
	was := g.isGang()
	if g.state != gangIdle {
		co.endTurnLocked(g, gangEndMemberLeft)
	}
	co.endLingerLocked(g) // the collective its kept members wait on cannot finish without c
	g.members = slices.DeleteFunc(g.members, func(m *client) bool { return m == c })
	c.gang = nil
	for _, q := range g.gpus() {
		co.markLocked(q, nil)
	}
	if was && !g.isGang() {
		c.gpu.log.Info("Gang dissolved", "gang", g.key, "turns", g.turns, "waited", g.waited)
		co.formed--
		g.ticket = 0
		co.metrics.gangs.Dec()
		co.metrics.forgetGang(g.key)
	}
	if len(g.members) == 0 {
		delete(co.byKey, g.key)
	}
}

// joinGang makes c a member of key's clients ("": none) and dispatches what its gang's forming allows.
func (q *queue) joinGang(c *client, key string) {
	if key == "" {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == stateGone {
		return
	}
	q.gangs.joinLocked(c, key)
	q.dispatchLocked(nil)
}
