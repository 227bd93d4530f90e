/*
 * Launch pacing: a bound on how much kernel and graph work an opportunistic process keeps outstanding
 * on the GPU (PACE, protocol 4; GPUSHARE_PACE_OVERRIDE). When the scheduler preempts such a process
 * for a production one, the process stops launching at once, but what it already queued keeps running
 * beside production's kernels; the bound keeps that backlog short.
 *
 * In GPU time (PACE_TIME, protocol 7) the bound B is nanoseconds of estimated run time: each launch weighs
 * its kind's estimate (one whose kind has none the bound divided by the count bound beside it, or
 * GPUSHARE_PACE_FULL_US without one), and a launch longer than B is let in only on an empty queue, so
 * what a preemption leaves queued is at most B plus the launch running then. In launches (PACE alone)
 * the bound B is in launches, each weighed by how long it runs: a launch that runs at least
 * GPUSHARE_PACE_FULL_US (100 us) counts as one, a shorter one as its fraction of that (in sixteenths,
 * never less than one), and a launch not timed yet as one. A training step mixes millisecond
 * convolutions with kernels of a few microseconds, each of which costs the CPU about as long to launch
 * as the GPU to run: counted as whole launches, a few of them fill the queue and the GPU waits for the
 * CPU (ResNet-50 training alone on an H100 ran at 74 % of its unbounded speed under a bound of 3
 * counted launches, 83 % weighed; docs/qos.md). Weighed, the CPU queues dozens of them behind a long
 * kernel, and the backlog a preemption leaves stays within about B launches of GPUSHARE_PACE_FULL_US
 * or more.
 *
 * Each context has a ring of up to MAX_OUTSTANDING (1024) launches in flight, one event each (made on
 * first use). Not every launch records its event: consecutive launches on one stream form a run that
 * the event of its last launch ends (RUN_MAX launches, or a quarter of B's weight; a launch on another
 * stream, on the per-thread stream, or one to be timed ends it), and a launch that finds the bound
 * reached ends the open run itself; a launch whose event completed completes the run before it. The
 * events are queried lazily: a launch retires what completed (in order) only when it is to be timed or
 * the weights outstanding and its own exceed B, and then waits while they still do. A launch's run time is the time between its event's and the previous one's
 * (cuEventElapsedTime), for a launch to be timed (its kind's first four, and every 64th launch: its
 * run ends right before it and its own event right after it), when the previous launch, on the same
 * stream, was still outstanding as this one was made, so that it started as that one ended; its kind (the kernel and its grid's size, or the
 * graph; gs_launch_key) keeps a running estimate. The bound is exact for the launches of one thread on
 * one stream per context (a PyTorch training step); launches on other streams are counted in order of
 * their making and may complete out of it, and several threads launching at once may each be one
 * launch past it.
 *
 * The wait polls cuEventQuery with a short sleep rather than blocking in cuEventSynchronize: between
 * polls it lets a capture begin on another thread (the poll is a call a capture must not run into),
 * a context go away, or a new bound (0) take effect, none of which a thread blocked inside the driver
 * could notice; and it waits only for work this process queued itself. If that work has not finished
 * after GPUSHARE_PACE_WAIT_MAX_MS (it may wait for something the process would do after this launch), or any
 * event call fails, pacing is turned off for a back-off (BACKOFF_MIN_MS, doubling with each further stall
 * up to BACKOFF_MAX_MS) and then re-armed: pacing never fails, and never holds up for long, a launch of
 * the application, and one stall (a long kernel, an NCCL wait) does not free the process of its bound for
 * good. A stalled process waits GPUSHARE_PACE_WAIT_MAX_MS at most once per back-off, so its stalls cost it
 * at most 2 s in 62 s once the back-off is long. Only a driver without the event calls turns pacing off
 * for good. The first turn-off is a warning, later ones debug lines; the scheduler learns each state
 * (gs_pace_state, PACING). A driver without cuEventElapsedTime times nothing: every launch counts as one.
 *
 * Nothing is recorded or waited for while any stream of the process captures (gs_capturing): a
 * record on a capturing stream becomes part of the graph, and a capture forbids the queries; a
 * launch during a capture is not counted. Events of a context are destroyed before the context is
 * (cuCtxDestroy, and a device's primary context released or reset), and never used after.
 *
 * With several GPUs (docs/multigpu.md) each GPU has its own bound, its scheduler's (or the override), and
 * a launch is counted in the ring of its stream's context against its stream's GPU's bound.
 *
 * Unpaced (bound 0, the default), a launch costs one relaxed atomic load more; everything here
 * runs only with a bound, under one mutex that a launch takes twice at most.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "gpushare_proto.h"
#include "internal.h"

#define MAX_OUTSTANDING 1024                 /* launches in flight per context, whatever the weights */
#define RING (MAX_OUTSTANDING + 1)            /* one more: the event before the oldest stays intact */
#define WHOLE 16                              /* a launch's weight, in sixteenths */
#define MAX_RINGS 32                          /* contexts paced at once; launches into others run unpaced */
#define KINDS 4096                            /* run-time estimates, by gs_launch_key: a direct-mapped table */
#define REAL(name) ((gs_fn_##name)gs_real(GS_ID_##name))

/* RESERVED: its launch is being made; RECORDED: its event follows it; SKIPPED: made without an event of its
 * own, complete once a later RECORDED slot of its run (the same stream) is; VOID: never recorded (a launch
 * that failed, a capture), retired as complete. */
enum { SLOT_RESERVED = 1, SLOT_RECORDED, SLOT_VOID, SLOT_SKIPPED };
#define RUN_MAX 16 /* launches at most in a run that one event marks the end of */

struct slot {
    uint64_t key;
    CUstream stream; /* where its event was recorded */
    uint32_t weight; /* its estimated run time, ns (in the count bound's unit: its share of a whole launch) */
    uint8_t state;
    uint8_t chained; /* timed: the previous launch was outstanding when this one was made */
    uint8_t sampled; /* to be timed: its event is recorded right after it */
    uint8_t record;  /* its event is recorded after it (a launch on another stream came after it) */
};

struct ring {
    CUcontext ctx; /* NULL: unused */
    CUdevice dev;  /* -1: unknown (forgotten with any device) */
    uint32_t gen;  /* bumped when the ring is dropped: a ticket of an older generation records nothing */
    int head, count; /* the oldest slot in use; slots in use (reserved by a launch, or recorded) */
    uint64_t load;   /* the weights of the slots in use, ns */
    int done;        /* the slot retired last when its event completed, else -1: the next one's start */
    uint64_t run_w;  /* the weights of the SKIPPED slots at the end of the ring, and their count */
    int run_n;
    uint64_t run_cap; /* a run's weight at most before its event is recorded: a quarter of the bound */
    CUevent ev[RING];
    struct slot s[RING];
};

#define BACKOFF_MIN_MS 1000u  /* pacing off after a first stall or driver error, then re-armed */
#define BACKOFF_MAX_MS 60000u /* ... doubling with each further one up to this */

enum { PACE_ON, PACE_BACKOFF, PACE_OFF };

_Atomic uint32_t gs_pace_max[GS_DEV_SLOTS];
atomic_int gs_pace_busy;
static _Atomic uint32_t sched_max[GS_DEV_SLOTS]; /* what each GPU's scheduler said last on its connection */
static _Atomic uint32_t sched_time_us[GS_DEV_SLOTS]; /* ... in GPU time (PACE_TIME) */
static _Atomic uint64_t time_ns[GS_DEV_SLOTS];       /* the bound in GPU time in force; 0: the count bound */
static _Atomic uint32_t count_max[GS_DEV_SLOTS];     /* the count bound in force beside it (0: none) */
static atomic_int pace_off;        /* PACE_BACKOFF after a driver error or a stall, until rearm_ns; PACE_OFF for good */
static _Atomic uint64_t rearm_ns;
static uint32_t backoff_ms; /* the next back-off (0: BACKOFF_MIN_MS); under mu */
static uint64_t turned_off; /* back-offs so far; under mu */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ring rings[MAX_RINGS];
static struct {
    uint64_t key;     /* 0: none */
    uint32_t ns;      /* a running estimate of its run time */
    uint32_t samples; /* times timed */
} kinds[KINDS];
static uint64_t paced, waited, wait_ns, ever, timed; /* under mu */

/* The bound in force on every GPU. Called under a gate's mutex for its scheduler's bound and the
 * environment's policy, and under mu by whichever thread turns pacing off or on again: apply_mu (a leaf)
 * orders them, so that each store reflects the latest of the three inputs. */
static pthread_mutex_t apply_mu = PTHREAD_MUTEX_INITIALIZER;
static void apply(void)
{
    pthread_mutex_lock(&apply_mu);
    for (int d = 0; d < GS_DEV_SLOTS; d++) {
        /* pace_override is the value in force (config.c: the scheduler may not allow it). */
        uint32_t m = gs_cfg.pace_override >= 0 ? (uint32_t)gs_cfg.pace_override : atomic_load(&sched_max[d]);
        int64_t to = gs_cfg.pace_time_override_us;
        uint64_t t = to >= 0 ? (uint64_t)to : atomic_load(&sched_time_us[d]);
        if (gs_cfg.pace_override == 0 && to < 0)
            t = 0; /* GPUSHARE_PACE_OVERRIDE=0: no bound at all */
        if (atomic_load(&pace_off) == PACE_OFF)
            m = 0, t = 0; /* during a back-off the bound stays stored, so that launches come here and re-arm it */
        atomic_store(&time_ns[d], t * 1000ull);
        atomic_store(&count_max[d], m);
        atomic_store(&gs_pace_max[d], m != 0 ? m : t != 0 ? 1u : 0u); /* the hooks' flag: a bound of either kind */
    }
    pthread_mutex_unlock(&apply_mu);
}

void gs_pace_reapply(void)
{
    apply();
}

void gs_pace_state(uint32_t *max_queued, uint32_t *state)
{
    int off = atomic_load(&pace_off);
    *max_queued = off == PACE_ON ? atomic_load(&gs_pace_max[gs_dev_cur]) : 0;
    if (off == PACE_OFF)
        *state = GS_PACING_OFF;
    else if (off == PACE_BACKOFF)
        *state = GS_PACING_BACKOFF;
    else if (gs_cfg.pace_override >= 0)
        *state = GS_PACING_OVERRIDE;
    else
        *state = GS_PACING_SCHEDULER;
}

void gs_pace_init(void)
{
    if (gs_cfg.pace_time_override_us > 0)
        gs_log(GS_LOG_INFO, "launch pacing: GPUSHARE_PACE_TIME_OVERRIDE_US=%lld us of GPU time outstanding at most",
               (long long)gs_cfg.pace_time_override_us);
    if (gs_cfg.pace_override > 0)
        gs_log(GS_LOG_INFO, "launch pacing: GPUSHARE_PACE_OVERRIDE=%lld launches outstanding at most",
               (long long)gs_cfg.pace_override);
    apply();
}

void gs_pace_set(uint32_t max_queued, int from_scheduler)
{
    uint32_t old = atomic_exchange(&sched_max[gs_dev_cur], max_queued);
    apply();
    if (!from_scheduler || old == max_queued)
        return;
    /* The GPU's name in the list form only: the single form's lines stay as they are. */
    const char *on = gs_multi ? " on " : "", *gpu = gs_multi ? gs_devs[gs_dev_cur].uuid : "";
    if (gs_cfg.pace_override >= 0)
        gs_log(GS_LOG_DEBUG, "the GPU scheduler asks for a launch bound of %u%s%s; GPUSHARE_PACE_OVERRIDE=%lld holds",
               max_queued, on, gpu, (long long)gs_cfg.pace_override);
    else if (max_queued != 0)
        gs_log(GS_LOG_INFO, "launch pacing%s%s: at most %u launches outstanding (the GPU scheduler's bound)", on, gpu,
               max_queued);
    else
        gs_log(GS_LOG_INFO, "launch pacing%s%s: unbounded (the GPU scheduler's bound)", on, gpu);
}

void gs_pace_set_time(uint32_t queue_us, int from_scheduler)
{
    uint32_t old = atomic_exchange(&sched_time_us[gs_dev_cur], queue_us);
    apply();
    if (!from_scheduler || old == queue_us)
        return;
    const char *on = gs_multi ? " on " : "", *gpu = gs_multi ? gs_devs[gs_dev_cur].uuid : "";
    if (gs_cfg.pace_time_override_us >= 0)
        gs_log(GS_LOG_DEBUG, "the GPU scheduler asks for a launch bound of %u us of GPU time%s%s; "
               "GPUSHARE_PACE_TIME_OVERRIDE_US=%lld holds", queue_us, on, gpu, (long long)gs_cfg.pace_time_override_us);
    else if (queue_us != 0)
        gs_log(GS_LOG_INFO, "launch pacing%s%s: at most %u us of GPU time outstanding (the GPU scheduler's bound)", on,
               gpu, queue_us);
    else
        gs_log(GS_LOG_DEBUG, "launch pacing%s%s: no bound in GPU time (the count bound holds)", on, gpu);
}

/* Off, with one warning the first time: for a back-off, or for good (r: the driver's error, or
 * CUDA_SUCCESS for none). mu held. */
static void turn_off_locked(const char *why, CUresult r, int for_good)
{
    if (atomic_load(&pace_off) != PACE_ON)
        return;
    char until[64] = "";
    if (for_good) {
        atomic_store(&pace_off, PACE_OFF);
    } else {
        uint32_t b = backoff_ms == 0 ? BACKOFF_MIN_MS : backoff_ms;
        backoff_ms = b * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : b * 2;
        atomic_store(&rearm_ns, gs_now_ns() + (uint64_t)b * 1000000ull);
        atomic_store(&pace_off, PACE_BACKOFF);
        snprintf(until, sizeof(until), " for %.1f s", (double)b / 1000.0);
    }
    apply();
    int level = turned_off++ == 0 || for_good ? GS_LOG_WARN : GS_LOG_DEBUG;
    if (r != CUDA_SUCCESS)
        gs_log(level, "launch pacing off for this process%s: %s (error %d); launches go on unbounded", until, why,
               (int)r);
    else
        gs_log(level, "launch pacing off for this process%s: %s; launches go on unbounded", until, why);
}

/* After a back-off: pacing on again (the scheduler's bound in force comes back). Any thread, mu not held. */
static void maybe_rearm(void)
{
    if (atomic_load(&pace_off) != PACE_BACKOFF || gs_now_ns() < atomic_load(&rearm_ns))
        return;
    pthread_mutex_lock(&mu);
    if (atomic_load(&pace_off) == PACE_BACKOFF) {
        atomic_store(&pace_off, PACE_ON);
        apply();
        gs_log(GS_LOG_DEBUG, "launch pacing on again after its back-off");
    }
    pthread_mutex_unlock(&mu);
}

/* Destroys a ring's events (their context still exists) and frees it. mu held. */
static void drop_locked(struct ring *g)
{
    int ok = gs_unsafe_begin(); /* never a driver call a capture runs into; else the events are left */
    for (int i = 0; i < RING; i++)
        if (ok && g->ev[i] != NULL)
            REAL(cuEventDestroy_v2)(g->ev[i]);
    if (ok)
        gs_unsafe_end();
    uint32_t gen = g->gen + 1;
    memset(g, 0, sizeof(*g));
    g->gen = gen;
}

/* The ring of ctx (the calling thread's current context), new when it has none; NULL when there is no
 * room or the driver lacks the event calls (pacing is then off). mu held. */
static struct ring *ring_for(CUcontext ctx)
{
    struct ring *fresh = NULL;
    for (int i = 0; i < MAX_RINGS; i++) {
        if (rings[i].ctx == ctx)
            return &rings[i];
        if (rings[i].ctx == NULL && fresh == NULL)
            fresh = &rings[i];
    }
    if (fresh == NULL)
        return NULL;
    if (REAL(cuEventCreate) == NULL || REAL(cuEventRecord) == NULL || REAL(cuEventQuery) == NULL ||
        REAL(cuEventDestroy_v2) == NULL || REAL(cuCtxGetDevice) == NULL) {
        turn_off_locked("the CUDA driver lacks the event calls it needs", CUDA_SUCCESS, 1);
        return NULL;
    }
    if (!gs_unsafe_begin())
        return NULL;
    CUdevice dev = -1;
    if (REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
        dev = -1;
    gs_unsafe_end();
    fresh->ctx = ctx;
    fresh->dev = dev;
    fresh->done = -1;
    return fresh;
}

static uint32_t kind_index(uint64_t key)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 52) % KINDS;
}

/* A whole launch of the count bound, ns: GPUSHARE_PACE_FULL_US (100 us when that is 0: every launch whole). */
static uint64_t unit_ns(void)
{
    uint64_t full = (uint64_t)gs_cfg.pace_full_us * 1000ull;
    return full != 0 ? full : 100000ull;
}

/* A launch's weight, ns. In GPU time (tb, the bound, not 0): its kind's estimate; while it has none, the
 * bound's share of one launch of the count bound beside it (so that launches not timed yet keep to that
 * count), or a whole unit without one.
 * Counted: its kind's estimate against GPUSHARE_PACE_FULL_US in sixteenths of a whole (at least one, at
 * most the whole), the whole while it has none or GPUSHARE_PACE_FULL_US is 0. mu held. */
static uint32_t weight_locked(uint64_t key, uint64_t tb)
{
    uint64_t full = (uint64_t)gs_cfg.pace_full_us * 1000ull, unit = unit_ns();
    uint32_t i = kind_index(key), m = atomic_load(&count_max[gs_dev_cur]);
    if (kinds[i].key != key && tb != 0 && m != 0)
        return (uint32_t)(tb / m < UINT32_MAX ? tb / m : UINT32_MAX);
    if (kinds[i].key != key)
        return (uint32_t)unit;
    if (tb != 0)
        return kinds[i].ns > 0 ? kinds[i].ns : 1;
    if (full == 0)
        return (uint32_t)unit;
    uint64_t w = ((uint64_t)kinds[i].ns * WHOLE + full - 1) / full;
    w = w < 1 ? 1 : w > WHOLE ? WHOLE : w;
    return (uint32_t)(w * full / WHOLE);
}

/* Whether this launch is timed: its kind has fewer than 4 estimates, and every 64th launch refreshes one.
 * A timed launch retires what completed before it is made, so that "the previous launch was outstanding"
 * is known; the others retire only when the bound is reached. mu held. */
static int sampled_locked(uint64_t key)
{
    uint32_t i = kind_index(key);
    return kinds[i].key != key || kinds[i].samples < 4 || (paced & 63) == 0;
}

/* Slot n completed after slot g->done: when it queued behind that one, the time between their events
 * is its run time. mu held, inside gs_unsafe_begin. */
static void time_locked(struct ring *g, int n)
{
    int p = g->done;
    gs_fn_cuEventElapsedTime elapsed = REAL(cuEventElapsedTime);
    if (p != (n + RING - 1) % RING || !g->s[n].chained || g->s[p].stream != g->s[n].stream || elapsed == NULL)
        return;
    float ms = 0;
    if (elapsed(&ms, g->ev[p], g->ev[n]) != CUDA_SUCCESS || !(ms > 0))
        return; /* timing refused (or the clock's resolution): estimates stay as they are */
    uint64_t ns = (uint64_t)((double)ms * 1e6);
    if (ns > UINT32_MAX)
        ns = UINT32_MAX;
    uint32_t i = kind_index(g->s[n].key);
    if (kinds[i].key != g->s[n].key) {
        if (kinds[i].key == 0)
            timed++;
        kinds[i].key = g->s[n].key;
        kinds[i].ns = (uint32_t)ns;
        kinds[i].samples = 1;
    } else {
        kinds[i].samples++;
        int64_t d = (int64_t)ns - (int64_t)kinds[i].ns;
        kinds[i].ns = (uint32_t)((int64_t)kinds[i].ns + d / 4); /* a running mean over the last few */
    }
}

/* Records slot s's event now, on its stream, after the launches made so far there (it is SKIPPED: its
 * launch was made). 0 when that failed (pacing is then off, or a capture runs: the slot is VOID). mu held. */
static int record_locked(struct ring *g, int s)
{
    if (!gs_unsafe_begin()) {
        g->s[s].state = SLOT_VOID;
        return 0;
    }
    CUresult r = REAL(cuEventRecord)(g->ev[s], g->s[s].stream);
    gs_unsafe_end();
    if (r != CUDA_SUCCESS) {
        g->s[s].state = SLOT_VOID;
        turn_off_locked("cuEventRecord failed", r, 0);
        return 0;
    }
    g->s[s].state = SLOT_RECORDED;
    if (s == (g->head + g->count - 1) % RING)
        g->run_w = 0, g->run_n = 0;
    return 1;
}

static void pop_locked(struct ring *g)
{
    int s = g->head;
    g->load -= g->s[s].weight;
    g->s[s].state = 0;
    g->head = (g->head + 1) % RING;
    g->count--;
}

/* Retires the slots whose launches completed, oldest first; a run of SKIPPED slots with the RECORDED slot
 * that ends it (with close, a run still open at the end of the ring is ended now: the bound is reached).
 * The number retired, or -1: stop pacing this launch (a capture began, or an error turned pacing off).
 * mu held. */
static int retire_locked(struct ring *g, int close)
{
    int n = 0;
    while (g->count > 0) {
        int s = g->head;
        if (g->s[s].state == SLOT_RESERVED)
            break; /* its launch is still being made on another thread, which records it next */
        if (g->s[s].state == SLOT_SKIPPED) {
            int k = 0, j = s;
            while (k < g->count && g->s[j].state == SLOT_SKIPPED)
                j = (s + ++k) % RING;
            if (k == g->count) {
                j = (s + k - 1) % RING; /* the run is open at the end of the ring */
                if (!close)
                    break;
                if (!record_locked(g, j) && atomic_load(&pace_off) != PACE_ON)
                    return -1;
            }
            if (g->s[j].state == SLOT_RESERVED)
                break;
            if (g->s[j].state == SLOT_RECORDED) {
                if (!gs_unsafe_begin())
                    return -1;
                CUresult r = REAL(cuEventQuery)(g->ev[j]);
                gs_unsafe_end();
                if (r == CUDA_ERROR_NOT_READY)
                    break;
                if (r != CUDA_SUCCESS) {
                    turn_off_locked("cuEventQuery failed", r, 0);
                    return -1;
                }
            }
            /* Complete (or VOID: unknown, taken as complete), and so is the run before it. */
            while (g->head != j) {
                pop_locked(g);
                n++;
            }
            g->done = g->s[j].state == SLOT_RECORDED ? j : -1;
            pop_locked(g);
            n++;
            continue;
        }
        if (g->s[s].state == SLOT_RECORDED) {
            if (!gs_unsafe_begin())
                return -1;
            CUresult r = REAL(cuEventQuery)(g->ev[s]);
            if (r == CUDA_SUCCESS)
                time_locked(g, s);
            gs_unsafe_end();
            if (r == CUDA_ERROR_NOT_READY)
                break;
            if (r != CUDA_SUCCESS) {
                turn_off_locked("cuEventQuery failed", r, 0);
                return -1;
            }
            g->done = s;
        } else {
            g->done = -1; /* never recorded: the next launch's start is unknown */
        }
        pop_locked(g);
        n++;
    }
    return n;
}

static void pause_wait(int round)
{
    if (round < 32) {
        sched_yield();
        return;
    }
    /* Then 20 us, and 40 us from the next round on: what is queued behind the oldest launch may be a few
     * short kernels, and the GPU idles for as long as the thread sleeps past their end. Longer sleeps
     * would save a waiting thread's CPU, not the GPU's time. */
    struct timespec ts = {0, round == 32 ? 20000L : 40000L};
    nanosleep(&ts, NULL);
}

/* Takes the next slot of g for a launch of this key and weight, its event made on first use; 0 when
 * that fails (pacing is then off). mu held, no capture running. */
static int reserve_locked(struct ring *g, int idx, uint64_t key, uint32_t w, int sampled, CUstream st,
                          struct gs_pace_ticket *t)
{
    if (g->count > 0) {
        /* A run ends with an event where the stream changes, and right before a launch to be timed (the
         * time from that event to its own is its run time). */
        int tail = (g->head + g->count - 1) % RING;
        int other = g->s[tail].stream != st;
        if (g->s[tail].state == SLOT_SKIPPED && (other || sampled)) {
            if (!record_locked(g, tail) && atomic_load(&pace_off) != PACE_ON)
                return 0;
            if (sampled && retire_locked(g, 0) < 0)
                return 0; /* whether this launch queues behind it, asked again */
        } else if (g->s[tail].state == SLOT_RESERVED) {
            g->s[tail].record = 1; /* made on another thread: its stream is not known yet */
        }
    }
    int s = (g->head + g->count) % RING;
    if (g->ev[s] == NULL) {
        if (!gs_unsafe_begin())
            return 0;
        CUresult r = REAL(cuEventCreate)(&g->ev[s], CU_EVENT_DEFAULT);
        gs_unsafe_end();
        if (r != CUDA_SUCCESS) {
            g->ev[s] = NULL;
            turn_off_locked("cuEventCreate failed", r, 0);
            return 0;
        }
    }
    int prev = (s + RING - 1) % RING;
    g->s[s] = (struct slot){.key = key, .state = SLOT_RESERVED, .weight = w, .sampled = (uint8_t)sampled,
                            .chained = sampled && g->count > 0 && g->s[prev].state == SLOT_RECORDED};
    g->count++;
    g->load += w;
    t->ring = idx;
    t->gen = g->gen;
    t->slot = s;
    return 1;
}

/* The context of a launch on s whose ring counts it: the current one, or in the list form the stream's when
 * another is current (then made current here until gs_pace_before returns: its events are made in it). */
static CUcontext launch_ctx(CUstream s, int *pushed)
{
    CUcontext ctx = NULL, sc = NULL;
    gs_fn_cuCtxGetCurrent current = REAL(cuCtxGetCurrent);
    *pushed = 0;
    if (current == NULL || current(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    if (!gs_multi || s == NULL || s == (CUstream)0x1 || s == CU_STREAM_PER_THREAD ||
        REAL(cuStreamGetCtx)(s, &sc) != CUDA_SUCCESS || sc == NULL || sc == ctx)
        return ctx;
    if (REAL(cuCtxPushCurrent_v2)(sc) != CUDA_SUCCESS)
        return NULL;
    *pushed = 1;
    return sc;
}

int gs_pace_before(struct gs_pace_ticket *t, uint64_t key, CUstream s)
{
    t->slot = -1;
    if (atomic_load_explicit(&pace_off, memory_order_relaxed) != PACE_ON) {
        maybe_rearm();
        if (atomic_load(&pace_off) != PACE_ON)
            return 0;
    }
    int pushed;
    CUcontext ctx = launch_ctx(s, &pushed);
    if (ctx == NULL)
        return 0; /* the launch fails without a context anyway */
    uint64_t start = 0, stuck = 0; /* when this launch began to wait; when the oldest slot last moved */
    int counted = 0, idx = -1;
    uint32_t gen = 0;
    atomic_fetch_add(&gs_pace_busy, 1);
    pthread_mutex_lock(&mu);
    for (int round = 0;; round++) {
        uint32_t max = atomic_load(&gs_pace_max[gs_dev_cur]);
        uint64_t tb = atomic_load(&time_ns[gs_dev_cur]);
        if (max == 0 || gs_capturing())
            break;
        uint64_t bound = tb != 0 ? tb : (uint64_t)max * unit_ns();
        struct ring *g;
        if (idx < 0) {
            g = ring_for(ctx);
            if (g == NULL)
                break;
            idx = (int)(g - rings);
            gen = g->gen;
        } else {
            g = &rings[idx];
            if (g->gen != gen)
                break; /* its context went away while this thread waited */
        }
        /* Lazily: the events are queried only for a timed launch and when the bound is reached. */
        int sampled = sampled_locked(key);
        uint32_t w = weight_locked(key, tb);
        int fits = g->count == 0 || (g->count < MAX_OUTSTANDING && g->load + w <= bound);
        if (sampled || !fits) {
            int r = retire_locked(g, !fits);
            if (r < 0)
                break;
            if (r > 0)
                stuck = 0;
            w = weight_locked(key, tb); /* after the retirements, which may have timed its kind */
            fits = g->count == 0 || (g->count < MAX_OUTSTANDING && g->load + w <= bound);
        }
        if (fits) {
            g->run_cap = bound / 4;
            counted = reserve_locked(g, idx, key, w, sampled, s, t);
            break;
        }
        uint64_t now = gs_now_ns();
        if (start == 0)
            start = now;
        if (stuck == 0) {
            stuck = now;
        } else if (now - stuck >= (uint64_t)gs_cfg.pace_wait_max_ms * 1000000ull) {
            int k = 0, j = g->head;
            while (k < g->count && g->s[j].state == SLOT_SKIPPED)
                j = (g->head + ++k) % RING;
            if (k < g->count && g->s[j].state == SLOT_RESERVED) {
                /* The thread that reserved it never came back to record: forget that record. */
                g->s[j].state = SLOT_VOID;
                stuck = 0;
                continue;
            }
            char why[160];
            snprintf(why, sizeof(why),
                     "this process's own GPU work did not finish within GPUSHARE_PACE_WAIT_MAX_MS=%u ms of waiting "
                     "(it may wait for something the process does later)",
                     gs_cfg.pace_wait_max_ms);
            turn_off_locked(why, CUDA_SUCCESS, 0);
            break;
        }
        pthread_mutex_unlock(&mu);
        /* A thread waiting here is inside a GPU call, not idle (gs_pace_busy): the lock is not released for
         * idleness meanwhile, which would drain the whole queue and hand the GPU over mid-step. */
        pause_wait(round);
        pthread_mutex_lock(&mu);
    }
    if (counted) {
        paced++;
        ever = 1;
    }
    if (start != 0) {
        waited++;
        wait_ns += gs_now_ns() - start;
    }
    pthread_mutex_unlock(&mu);
    if (pushed) {
        CUcontext c;
        REAL(cuCtxPopCurrent_v2)(&c);
    }
    /* The activity mark restarts the idle window at this call's end, whatever the tick saw meanwhile. */
    atomic_fetch_add_explicit(&gs_hot[gs_dev_cur].word, GS_ACTIVITY_ONE, memory_order_relaxed);
    atomic_fetch_sub(&gs_pace_busy, 1);
    return counted;
}

void gs_pace_after(const struct gs_pace_ticket *t, CUstream s, CUresult launched)
{
    if (t->slot < 0)
        return;
    pthread_mutex_lock(&mu);
    struct ring *g = &rings[t->ring];
    struct slot *z = &g->s[t->slot];
    if (g->gen == t->gen && z->state == SLOT_RESERVED) {
        z->stream = s;
        /* A launch that failed queued nothing; a capture that began meanwhile would take the record.
         * Others join the run of launches one event ends: a quarter of the bound's weight, RUN_MAX
         * launches, a launch on another stream after it, a launch to be timed, or the per-thread stream
         * (only this thread can record there) end it. */
        int tail = t->slot == (g->head + g->count - 1) % RING;
        if (launched != CUDA_SUCCESS || atomic_load(&pace_off)) {
            z->state = SLOT_VOID;
        } else if (z->sampled || z->record || !tail || s == CU_STREAM_PER_THREAD || g->run_n + 1 >= RUN_MAX ||
                   g->run_w + z->weight >= g->run_cap) {
            z->state = SLOT_SKIPPED;
            record_locked(g, t->slot);
        } else {
            z->state = SLOT_SKIPPED;
            g->run_w += z->weight;
            g->run_n++;
        }
    }
    pthread_mutex_unlock(&mu);
}

void gs_pace_forget_ctx(CUcontext ctx)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_RINGS; i++)
        if (rings[i].ctx != NULL && rings[i].ctx == ctx)
            drop_locked(&rings[i]);
    pthread_mutex_unlock(&mu);
}

void gs_pace_forget_dev(CUdevice dev)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_RINGS; i++)
        if (rings[i].ctx != NULL && (rings[i].dev == dev || rings[i].dev == -1))
            drop_locked(&rings[i]);
    pthread_mutex_unlock(&mu);
}

void gs_pace_log_stats(void)
{
    pthread_mutex_lock(&mu);
    uint64_t p = paced, w = waited, ns = wait_ns, e = ever, k = timed, off = turned_off;
    pthread_mutex_unlock(&mu);
    if (e)
        gs_log(GS_LOG_INFO,
               "launch pacing: %llu launches paced, %llu waited for earlier work, %.3f s waiting in all; %llu kinds "
               "of launch timed; %llu back-offs",
               (unsigned long long)p, (unsigned long long)w, (double)ns / 1e9, (unsigned long long)k,
               (unsigned long long)off);
}

/* The child of fork() has none of the parent's contexts (CUDA does not survive fork) and is a new
 * client of the scheduler: no events, no scheduler bound until its own connection sends one, and a
 * driver of its own (what turned pacing off in the parent is for it to find again). */
void gs_pace_atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&apply_mu, NULL);
    for (int i = 0; i < MAX_RINGS; i++)
        if (rings[i].ctx != NULL) /* the others were never touched: left so, their pages stay shared */
            memset(&rings[i], 0, sizeof(rings[i]));
    paced = waited = wait_ns = ever = turned_off = 0; /* the estimates stay: the same kernels run as long in the child */
    backoff_ms = 0;
    atomic_store(&gs_pace_busy, 0); /* the forking thread is not in a launch; no other thread came along */
    for (int d = 0; d < GS_DEV_SLOTS; d++) {
        atomic_store(&sched_max[d], 0);
        atomic_store(&sched_time_us[d], 0);
    }
    atomic_store(&pace_off, PACE_ON);
    apply();
}
