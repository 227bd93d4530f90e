package soak

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpusharing/gpusharing/agent/dra"
	"github.com/gpusharing/gpusharing/agent/share"
	"github.com/gpusharing/gpusharing/test/freezer"
)

// namespace holds every pod of the soak.
const namespace = "soak"

// Sizes of the soak's world: claims of 128 to 512 MiB; each process's context holds ctxBytes on the
// stub driver, within the scheduler's context reserve.
const (
	mib      = 1 << 20
	ctxBytes = 48 * mib
	maxProcs = 3 // per pod
)

// pod is one pod of the soak: its GPUs (stub device indices) and its running processes.
type pod struct {
	name     string
	priority int32
	gpus     []int
	procs    []*proc
	// dropped: one of its processes ran without the shim; its memory is then judged by the guard alone.
	dropped bool
}

// uid is the pod's UID, as its processes' cgroups name it and the kubelet plugin records it for its claims.
func (p *pod) uid() string { return "uid-" + p.name }

// episode is one seed's run: a node of 2-4 stub GPUs, its pods and claims, the scheduler.
type episode struct {
	seed uint64
	rng  *rand.Rand
	// lies draws the lies, a stream of its own: they come on top of the steps, which stay the seed's.
	lies      *rand.Rand
	shimBuild string
	dir, hold string
	uuids     []string
	pods      []*pod
	claims    []dra.SizedClaim
	l         *lookups
	s         *sched
	chk       *checker
	step      int
	// without are the faults left out (SOAK_WITHOUT): each still draws its numbers, so the other steps of
	// a seed stay what they were.
	without map[string]bool
	// counts are the steps by kind, for the summary.
	counts map[string]int
	// cgroups: each process runs in a cgroup of its own, as a one-process container, and a stall freezes
	// it there or stops it with SIGSTOP (by the parity of its length in ms, so that a seed's steps stay
	// its own). Off with SOAK_WITHOUT=freeze, and where the machine cannot make cgroups (cgroupsUsable).
	cgroups bool
}

func (e *episode) did(kind string) {
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	e.counts[kind]++
}

// faults are the names SOAK_WITHOUT takes.
var faults = []string{"kill", "exit", "stall", "freeze", "drop", "restart", "lookup-fail", "lookup-slow", "past-claim", "lie"}

// cgroupsUsable says whether this machine makes the freezer cgroups a stall may freeze (root and cgroup
// v2, alone or beside v1), once.
var cgroupsUsable = sync.OnceValue(func() bool {
	c, err := freezer.Make("v2")
	if err != nil {
		return false
	}
	return c.Remove() == nil
})

func uuidOf(d int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-0000000000%02x", d) }

// newEpisode draws the node, the pods and the claims from the seed.
func newEpisode(seed uint64, shimBuild, dir string) *episode {
	e := &episode{seed: seed, rng: rand.New(rand.NewPCG(seed, 0x50a4)), lies: rand.New(rand.NewPCG(seed, 0x11e)),
		shimBuild: shimBuild, dir: dir,
		hold: filepath.Join(dir, "hold")}
	n := 2 + e.rng.IntN(3)
	for d := range n {
		e.uuids = append(e.uuids, uuidOf(d))
	}
	npods := 3 + e.rng.IntN(4)
	for i := range npods {
		p := &pod{name: fmt.Sprintf("p%d", i)}
		if e.rng.IntN(3) == 0 {
			p.priority = productionPriority
		}
		p.gpus = []int{e.rng.IntN(n)}
		if e.rng.IntN(4) == 0 { // a pod on two GPUs: a gang
			if o := e.rng.IntN(n); o != p.gpus[0] {
				p.gpus = append(p.gpus, o)
			}
		}
		e.pods = append(e.pods, p)
		for _, g := range p.gpus { // every pod has a claim of its own on each of its GPUs
			e.claim(g, p)
		}
	}
	// Shared claims (two pods in one) and chains (a pod in a shared claim and one of its own).
	for range e.rng.IntN(3) {
		a, b := e.pods[e.rng.IntN(npods)], e.pods[e.rng.IntN(npods)]
		if a == b {
			continue
		}
		for _, g := range a.gpus {
			if slices.Contains(b.gpus, g) {
				e.claim(g, a, b)
			}
		}
	}
	e.l = &lookups{pods: map[int32]*pod{}, claims: e.claims}
	for _, p := range e.pods {
		e.trace("pod %s priority %d GPUs %v", p.name, p.priority, p.gpus)
	}
	for _, c := range e.claims {
		e.trace("claim %s %s %d MiB pods %v", c.Name, c.GPU, c.MemoryBytes/mib, c.Pods)
	}
	return e
}

// claim adds a claim on gpu reserved for pods, recorded with their names and UIDs as the kubelet plugin
// records it.
func (e *episode) claim(gpu int, pods ...*pod) {
	var names []string
	var uids []types.UID
	for _, p := range pods {
		names = append(names, p.name)
		uids = append(uids, types.UID(p.uid()))
	}
	e.claims = append(e.claims, dra.SizedClaim{Namespace: namespace, Name: fmt.Sprintf("c%d", len(e.claims)), Pods: names,
		PodUIDs: uids, GPU: e.uuids[gpu], MemoryBytes: int64(128+128*e.rng.IntN(4)) * mib})
}

// own is what the claims that list pod give it on gpu.
func (e *episode) own(gpu string, name string) int64 {
	var b int64
	for _, c := range e.claims {
		if c.GPU == gpu && slices.Contains(c.Pods, name) {
			b += c.MemoryBytes
		}
	}
	return b
}

// limit is the shim's memory limit of a pod on gpu, as the kubelet plugin writes it for its claims there
// (dra.SizedLimits of their sum).
func (e *episode) limit(gpu string, name string) int64 {
	d, err := dra.SizedLimits(share.Device{Kind: share.KindShared},
		map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: *resource.NewQuantity(e.own(gpu, name), resource.BinarySI)},
		contextReserve)
	if err != nil {
		e.fail(fmt.Errorf("limits of pod %s on %s: %w", name, gpu, err))
	}
	return d.MemoryLimitBytes
}

// env is a process's environment: the shim over the stub driver, the pod's GPUs, sockets and limits
// (what the kubelet plugin gives its claims on each GPU).
func (e *episode) env(p *pod) []string {
	var ids, socks, limits []string
	for _, g := range p.gpus {
		u := e.uuids[g]
		ids = append(ids, u)
		socks = append(socks, u+"="+filepath.Join(e.dir, u+".sock"))
		limits = append(limits, fmt.Sprintf("%s=%d", u, e.limit(u, p.name)))
	}
	env := []string{
		"LD_LIBRARY_PATH=" + filepath.Join(e.shimBuild, "stub"),
		fmt.Sprintf("GPUSHARE_STUB_DEVICES=%d", len(e.uuids)),
		"GPUSHARE_STUB_LAUNCH_US=2000",
		"GPUSHARE_STUB_HOLD_DIR=" + e.hold,
		fmt.Sprintf("GPUSHARE_STUB_CTX_BYTES=%d", ctxBytes),
		"GPUSHARE_GPU_UUID=" + strings.Join(ids, ","),
	}
	if len(ids) == 1 {
		env = append(env, "GPUSHARE_SOCKET="+filepath.Join(e.dir, ids[0]+".sock"),
			fmt.Sprintf("GPUSHARE_MEMORY_LIMIT_BYTES=%d", e.limit(ids[0], p.name)))
	} else {
		env = append(env, "GPUSHARE_SOCKET="+strings.Join(socks, ","), "GPUSHARE_MEMORY_LIMIT_BYTES="+strings.Join(limits, ","))
	}
	return env
}

// live lists the running processes in a stable order.
func (e *episode) live() []*proc {
	var out []*proc
	for _, p := range e.pods {
		out = append(out, p.procs...)
	}
	return out
}

func (e *episode) remove(pr *proc) {
	p := pr.pod
	p.procs = slices.DeleteFunc(p.procs, func(q *proc) bool { return q == pr })
	e.l.set(pr.pid, nil)
	forget(e.hold, pr.pid)
	if pr.cg != nil {
		if err := pr.cg.Remove(); err != nil {
			e.fail(fmt.Errorf("pid %d's cgroup: %w", pr.pid, err))
		}
	}
	e.chk.gone(pr)
}

// tracing prints every step (SOAK_TRACE=1), to read what led to a violation; SOAK_TRACE=steps prints
// the steps without the scheduler's log, whose writing can change a timing-dependent path.
var (
	tracing   = os.Getenv("SOAK_TRACE") != ""
	stepsOnly = os.Getenv("SOAK_TRACE") == "steps"
)

func (e *episode) trace(format string, args ...any) {
	if tracing {
		fmt.Fprintf(os.Stderr, "seed=%d step=%d %s\n", e.seed, e.step, fmt.Sprintf(format, args...))
	}
}

// fail is a violation of no numbered invariant: a client hung or the harness could not act.
func (e *episode) fail(err error) { e.chk.violate(0, err.Error()) }

// act draws and runs one step. Every choice is the seed's: which step does what depends on no timing.
func (e *episode) act() {
	e.step++
	e.chk.setStep(e.step)
	e.l.mu.Lock()
	e.l.step = e.step
	if e.l.failTill == e.step { // the lookups answer again from here: invariant 1's bounds count from now
		e.chk.reset()
	}
	e.l.mu.Unlock()
	// A stalled process is picked like any other: a command waits for its answer until the stall ends.
	ready := e.live()
	if liar, bytes := e.lies.IntN(100), int64(1+e.lies.IntN(512))*mib; liar < len(ready) && !e.without["lie"] {
		e.lie(ready[liar], bytes)
	}
	w := e.rng.IntN(100)
	pick := func() *proc {
		if len(ready) == 0 {
			return nil
		}
		return ready[e.rng.IntN(len(ready))]
	}
	// Each branch draws its arguments before it looks at anything the run decided.
	switch {
	case w < 14 || len(ready) == 0:
		p := e.pods[e.rng.IntN(len(e.pods))]
		if len(p.procs) < maxProcs {
			e.did("spawn")
			e.spawn(p)
		}
	case w < 44:
		pr, k, past := pick(), e.rng.IntN(8), e.rng.IntN(10) == 0
		g := pr.pod.gpus[k%len(pr.pod.gpus)]
		size := int64(1+e.rng.IntN(64)) * mib
		if past && !e.without["past-claim"] { // past the claim: the shim must refuse it
			size = e.own(e.uuids[g], pr.pod.name) + mib
			e.did("alloc-past-claim")
		}
		e.did("alloc")
		e.cmd(pr, "alloc %d %d", g, size)
	case w < 58:
		pr, k := pick(), e.rng.IntN(8)
		e.did("free")
		e.cmd(pr, "free %d", pr.pod.gpus[k%len(pr.pod.gpus)])
	case w < 85:
		pr, k, n := pick(), e.rng.IntN(8), 1+e.rng.IntN(40)
		e.did("launch")
		e.cmd(pr, "launch %d %d", pr.pod.gpus[k%len(pr.pod.gpus)], n)
	case w < 90:
		pr := pick()
		if e.without["kill"] {
			return
		}
		e.did("kill")
		e.trace("%s pid %d: SIGKILL", pr.pod.name, pr.pid)
		pr.kill()
		e.remove(pr)
	case w < 93:
		pr := pick()
		if e.without["exit"] {
			return
		}
		e.did("exit")
		e.trace("%s pid %d: exit", pr.pod.name, pr.pid)
		pr.exit()
		e.remove(pr)
	case w < 95:
		pr, d := pick(), time.Duration(100+e.rng.IntN(2900))*time.Millisecond
		if e.without["stall"] {
			return
		}
		e.did("stall")
		freeze := pr.cg != nil && d.Milliseconds()%2 == 1
		how := "SIGSTOP"
		if freeze {
			e.did("freeze")
			how = "its cgroup frozen"
		}
		e.trace("%s pid %d: %s for %s", pr.pod.name, pr.pid, how, d)
		e.chk.stopped(pr) // before the stall can end
		pr.stall(d, freeze, func() { e.chk.continued(pr) })
	case w < 96:
		pr := pick()
		if pr.dropped || e.without["drop"] {
			return
		}
		e.did("drop")
		pr.dropped, pr.pod.dropped = true, true
		if r, err := pr.do("drop"); err != nil || r != "drop" {
			e.fail(fmt.Errorf("pid %d did not drop the shim: %q %v", pr.pid, r, err))
		}
		// The drop is when the process answers: a stopped process drops only once it continues (seed
		// 30045 asked one 2.5 s before its stall ended and held the naming bound to the asking).
		e.chk.drop(pr)
		for _, d := range slices.Sorted(maps.Keys(pr.ctx)) {
			e.cmd(pr, "ctx %d", d)
		}
	case w < 97:
		if e.without["restart"] {
			return
		}
		e.did("restart")
		e.trace("scheduler restart")
		e.chk.restarting()
		e.s.down()
		if err := e.s.up(); err != nil {
			e.fail(fmt.Errorf("restarting the scheduler: %w", err))
		}
		e.chk.agent.restarted() // the scheduler runs in the agent: it restarts too
		e.chk.restarted()
	default:
		delay, fail, steps := []time.Duration{0, 0, 100 * time.Millisecond, 250 * time.Millisecond}[e.rng.IntN(4)], e.rng.IntN(3) == 0,
			3+e.rng.IntN(20)
		if e.without["lookup-slow"] {
			delay = 0
		}
		fail = fail && !e.without["lookup-fail"]
		if delay > 0 {
			e.did("lookup-slow")
		}
		if fail {
			e.did("lookup-fail")
		}
		e.trace("pod lookups: delay %s, failing %t for %d steps", delay, fail, steps)
		e.l.mu.Lock()
		e.l.delay = delay
		if fail {
			e.l.failTill = e.step + steps
		}
		e.l.mu.Unlock()
	}
}

// lie has pr open a second connection to one of its GPUs' schedulers, past the shim, and announce a
// grant of bytes it never had (RETURN HOLD): the ledger must count it as held, refuse others accordingly,
// and give it back when the process ends.
func (e *episode) lie(pr *proc, bytes int64) {
	if pr.dropped || pr.isStopped() {
		return
	}
	e.did("lie")
	g := pr.pod.gpus[int(bytes/mib)%len(pr.pod.gpus)]
	e.cmd(pr, "lie %s %d", filepath.Join(e.dir, e.uuids[g]+".sock"), bytes)
}

// spawn starts a process of p and gives it a context on each of the pod's GPUs.
func (e *episode) spawn(p *pod) {
	pr, err := start(e.shimBuild, p, e.env(p), e.cgroups)
	if err != nil {
		e.fail(err)
		return
	}
	e.l.set(pr.pid, p)
	p.procs = append(p.procs, pr)
	e.trace("%s pid %d: started", p.name, pr.pid)
	for _, g := range p.gpus {
		e.cmd(pr, "ctx %d", g)
	}
}

// cmd runs one command of pr and notes what it changed.
func (e *episode) cmd(pr *proc, format string, args ...any) {
	r, err := pr.do(format, args...)
	e.trace("%s pid %d: %s -> %s", pr.pod.name, pr.pid, fmt.Sprintf(format, args...), r)
	if err != nil {
		e.fail(err)
		pr.kill()
		e.remove(pr)
		return
	}
	var d int
	if _, err := fmt.Sscanf(r, "ctx %d", &d); err == nil && ok(r) {
		pr.ctx[d] = true
		e.chk.ctx(pr, d)
	}
}

// end stops every process and waits for the node to come back to zero (invariant 6).
func (e *episode) end() {
	e.l.mu.Lock()
	if e.l.failTill > e.l.step { // a lookup fault still on: it ends here, and the bounds count from now
		e.l.failTill = e.l.step
		e.chk.reset()
	}
	e.l.mu.Unlock()
	e.chk.awaitUnmanaged()
	for _, pr := range e.live() {
		pr.kill()
		e.remove(pr)
	}
	e.chk.settle()
}

func (e *episode) run(steps int) {
	if err := os.MkdirAll(e.hold, 0o755); err != nil {
		e.fail(err)
		return
	}
	e.s = newSched(e.dir, e.hold, e.uuids, e.l)
	if err := e.s.up(); err != nil {
		e.fail(err)
		return
	}
	e.chk = newChecker(e)
	e.chk.agent = newAgentView(e)
	e.chk.agent.start()
	e.chk.startSampling()
	for range steps {
		if e.chk.failed() {
			break
		}
		e.act()
		e.chk.checkNow()
	}
	e.end()
	e.chk.stopSampling()
	e.chk.agent.stopRunning()
	e.s.down()
}
