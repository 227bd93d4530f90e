/*
 * Launch pacing: a bound on how many kernel and graph launches an opportunistic process keeps
 * outstanding on the GPU (PACE, protocol 4; GPUSHARE_PACE_OVERRIDE). When the scheduler preempts
 * such a process for a production one, the process stops launching at once, but what it already
 * queued keeps running beside production's kernels; the bound keeps that backlog short.
 *
 * With a bound B, each context has a ring of up to RING_EVENTS events. The paced launches are cut into
 * segments, S = min(B, RING_EVENTS) of them in flight at most, whose lengths (B / S, rounded up or down
 * in turn) add up to B over any S in a row. After the last launch of a segment its own thread records
 * the next event of the ring on the launch's stream; before a launch, when S events are in flight,
 * the thread waits until the oldest has completed. The launches left unfinished are then those of at
 * most S segments in a row: B. The bound is exact for launches of one thread on one stream per
 * context (a PyTorch training step); launches on other streams between two records are counted but
 * not waited for, and several threads launching at once may each be one launch past it.
 *
 * The wait polls cuEventQuery with a short sleep rather than blocking in cuEventSynchronize: between
 * polls it lets a capture begin on another thread (the poll is a call a capture must not run into),
 * a context go away, or a new bound (0) take effect, none of which a thread blocked inside the driver
 * could notice; and it waits only for work this process queued itself. If that work has not finished
 * after GPUSHARE_PACE_WAIT_MAX_MS (it may wait for something the process would do after this launch), or any
 * event call fails, pacing is turned off for the process with one warning: pacing never fails,
 * and never holds up for long, a launch of the application.
 *
 * Nothing is recorded or waited for while any stream of the process captures (gs_capturing): a
 * record on a capturing stream becomes part of the graph, and a capture forbids the queries; a
 * launch during a capture is not counted. Events of a context are destroyed before the context is
 * (cuCtxDestroy, and a device's primary context released or reset), and never used after.
 *
 * Unpaced (bound 0, the default), a launch costs one relaxed atomic load more; everything here
 * runs only with a bound, under one mutex that a launch takes twice at most.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "internal.h"

#define RING_EVENTS 4
#define MAX_RINGS 32                            /* contexts paced at once; launches into others run unpaced */
#define REAL(name) ((gs_fn_##name)gs_real(GS_ID_##name))

enum { SLOT_RESERVED = 1, SLOT_RECORDED, SLOT_VOID };

struct ring {
    CUcontext ctx;   /* NULL: unused */
    CUdevice dev;    /* -1: unknown (forgotten with any device) */
    uint32_t gen;    /* bumped when the ring is dropped: a ticket of an older generation records nothing */
    int head, count; /* the oldest slot in use; slots in use (reserved by a launch, or recorded) */
    uint32_t since;  /* launches counted since the last slot was reserved */
    uint32_t seg;    /* segments cut so far: the next one's place in the pattern of lengths */
    CUevent ev[RING_EVENTS];
    uint8_t state[RING_EVENTS];
};

_Atomic uint32_t gs_pace_max;
static _Atomic uint32_t sched_max; /* what the scheduler said last on this connection */
static atomic_int pace_off;        /* turned off after a driver error or a stall */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ring rings[MAX_RINGS];
static uint64_t paced, waited, wait_ns, ever; /* under mu */

/* The bound in force. Called under the gate's mutex for the scheduler's bound, and by whichever thread
 * turns pacing off: the second look at pace_off keeps a bound stored by the former from outliving the
 * latter's 0 (pace_off is set before that thread stores). */
static void apply(void)
{
    uint32_t m = gs_cfg.pace_override >= 0 ? (uint32_t)gs_cfg.pace_override : atomic_load(&sched_max);
    if (atomic_load(&pace_off))
        m = 0;
    atomic_store(&gs_pace_max, m);
    if (m != 0 && atomic_load(&pace_off))
        atomic_store(&gs_pace_max, 0);
}

void gs_pace_init(void)
{
    if (gs_cfg.pace_override > 0)
        gs_log(GS_LOG_INFO, "launch pacing: GPUSHARE_PACE_OVERRIDE=%lld launches outstanding at most",
               (long long)gs_cfg.pace_override);
    apply();
}

void gs_pace_set(uint32_t max_queued, int from_scheduler)
{
    uint32_t old = atomic_exchange(&sched_max, max_queued);
    apply();
    if (!from_scheduler || old == max_queued)
        return;
    if (gs_cfg.pace_override >= 0)
        gs_log(GS_LOG_DEBUG, "the GPU scheduler asks for a launch bound of %u; GPUSHARE_PACE_OVERRIDE=%lld holds",
               max_queued, (long long)gs_cfg.pace_override);
    else if (max_queued != 0)
        gs_log(GS_LOG_INFO, "launch pacing: at most %u launches outstanding (the GPU scheduler's bound)", max_queued);
    else
        gs_log(GS_LOG_INFO, "launch pacing: unbounded (the GPU scheduler's bound)");
}

/* For good, with one warning (r: the driver's error, or CUDA_SUCCESS for none). mu held. */
static void turn_off_locked(const char *why, CUresult r)
{
    if (atomic_exchange(&pace_off, 1))
        return;
    apply();
    if (r != CUDA_SUCCESS)
        gs_log(GS_LOG_WARN, "launch pacing off for this process: %s (error %d); launches go on unbounded", why,
               (int)r);
    else
        gs_log(GS_LOG_WARN, "launch pacing off for this process: %s; launches go on unbounded", why);
}

/* Destroys a ring's events (their context still exists) and frees it. mu held. */
static void drop_locked(struct ring *g)
{
    int ok = gs_unsafe_begin(); /* never a driver call a capture runs into; else the events are left */
    for (int i = 0; i < RING_EVENTS; i++)
        if (ok && g->ev[i] != NULL)
            REAL(cuEventDestroy_v2)(g->ev[i]);
    if (ok)
        gs_unsafe_end();
    uint32_t gen = g->gen + 1;
    *g = (struct ring){.gen = gen};
}

/* The ring of ctx (the calling thread's current context), made with its events when new; NULL when
 * there is no room or the events cannot be made (pacing is then off). mu held, no capture running. */
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
        turn_off_locked("the CUDA driver lacks the event calls it needs", CUDA_SUCCESS);
        return NULL;
    }
    if (!gs_unsafe_begin())
        return NULL;
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < RING_EVENTS && r == CUDA_SUCCESS; i++)
        r = REAL(cuEventCreate)(&fresh->ev[i], CU_EVENT_DISABLE_TIMING);
    CUdevice dev = -1;
    if (r == CUDA_SUCCESS && REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
        dev = -1;
    gs_unsafe_end();
    fresh->ctx = ctx; /* so that drop_locked destroys what was made */
    fresh->dev = dev;
    if (r != CUDA_SUCCESS) {
        drop_locked(fresh);
        turn_off_locked("cuEventCreate failed", r);
        return NULL;
    }
    return fresh;
}

/* Frees the oldest slot if its launch is known to be done. 1: freed; 0: not yet; -1: stop pacing
 * this launch (a capture began, or an error turned pacing off). mu held. */
static int retire_locked(struct ring *g)
{
    int s = g->head;
    if (g->state[s] == SLOT_RESERVED)
        return 0; /* its launch is still being made on another thread, which records it next */
    if (g->state[s] == SLOT_RECORDED) {
        if (!gs_unsafe_begin())
            return -1;
        CUresult r = REAL(cuEventQuery)(g->ev[s]);
        gs_unsafe_end();
        if (r == CUDA_ERROR_NOT_READY)
            return 0;
        if (r != CUDA_SUCCESS) {
            turn_off_locked("cuEventQuery failed", r);
            return -1;
        }
    }
    g->state[s] = 0;
    g->head = (g->head + 1) % RING_EVENTS;
    g->count--;
    return 1;
}

static void pause_wait(int round)
{
    if (round < 32) {
        sched_yield();
        return;
    }
    /* Then 20 us, and 40 us from the next round on: with a small bound (the default is 3) what is queued
     * behind the oldest segment may be a few short kernels, and the GPU idles for as long as the thread
     * sleeps past their end. Longer sleeps would save a waiting thread's CPU, not the GPU's time. */
    struct timespec ts = {0, round == 32 ? 20000L : 40000L};
    nanosleep(&ts, NULL);
}

int gs_pace_before(struct gs_pace_ticket *t)
{
    t->slot = -1;
    if (atomic_load_explicit(&pace_off, memory_order_relaxed))
        return 0;
    CUcontext ctx = NULL;
    gs_fn_cuCtxGetCurrent current = REAL(cuCtxGetCurrent);
    if (current == NULL || current(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return 0; /* the launch fails without a context anyway */
    uint64_t start = 0, stuck = 0; /* when this launch began to wait; when the oldest slot last moved */
    int counted = 0, idx = -1;
    uint32_t gen = 0;
    pthread_mutex_lock(&mu);
    for (int round = 0;; round++) {
        uint32_t max = atomic_load(&gs_pace_max);
        if (max == 0 || gs_capturing())
            break;
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
        uint32_t slots = max < RING_EVENTS ? max : RING_EVENTS;
        int r = g->count >= (int)slots ? retire_locked(g) : 1;
        if (r < 0)
            break;
        if (r == 0) {
            uint64_t now = gs_now_ns();
            if (start == 0)
                start = now;
            if (stuck == 0) {
                stuck = now;
            } else if (now - stuck >= (uint64_t)gs_cfg.pace_wait_max_ms * 1000000ull) {
                if (g->state[g->head] == SLOT_RESERVED) {
                    /* The thread that reserved it never came back to record: forget that record. */
                    g->state[g->head] = SLOT_VOID;
                    stuck = 0;
                    continue;
                }
                char why[160];
                snprintf(why, sizeof(why),
                         "this process's own GPU work did not finish within GPUSHARE_PACE_WAIT_MAX_MS=%u ms of waiting "
                         "(it may wait for something the process does later)",
                         gs_cfg.pace_wait_max_ms);
                turn_off_locked(why, CUDA_SUCCESS);
                break;
            }
            pthread_mutex_unlock(&mu);
            /* A thread waiting here is inside a GPU call, not idle: the lock is not released for idleness
             * meanwhile (that would drain the whole queue and hand the GPU over mid-step). */
            atomic_fetch_add_explicit(&gs_gate_word, GS_ACTIVITY_ONE, memory_order_relaxed);
            pause_wait(round);
            pthread_mutex_lock(&mu);
            continue;
        }
        if (g->count >= (int)slots)
            continue; /* a smaller bound than the ring holds: retire down to it */
        uint32_t j = g->seg % slots; /* segment j of a pattern of slots segments that add up to max */
        uint64_t len = (uint64_t)(j + 1) * max / slots - (uint64_t)j * max / slots;
        if (++g->since >= len) {
            g->since = 0;
            g->seg++;
            int s = (g->head + g->count) % RING_EVENTS;
            g->state[s] = SLOT_RESERVED;
            g->count++;
            t->ring = idx;
            t->gen = gen;
            t->slot = s;
        }
        counted = 1;
        break;
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
    return counted;
}

void gs_pace_after(const struct gs_pace_ticket *t, CUstream s, CUresult launched)
{
    if (t->slot < 0)
        return;
    pthread_mutex_lock(&mu);
    struct ring *g = &rings[t->ring];
    if (g->gen == t->gen && g->state[t->slot] == SLOT_RESERVED) {
        int ok = 0;
        /* A launch that failed queued nothing; a capture that began meanwhile would take the record. */
        if (launched == CUDA_SUCCESS && !atomic_load(&pace_off) && gs_unsafe_begin()) {
            CUresult r = REAL(cuEventRecord)(g->ev[t->slot], s);
            gs_unsafe_end();
            if (r == CUDA_SUCCESS)
                ok = 1;
            else
                turn_off_locked("cuEventRecord failed", r);
        }
        g->state[t->slot] = ok ? SLOT_RECORDED : SLOT_VOID;
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
    uint64_t p = paced, w = waited, ns = wait_ns, e = ever;
    pthread_mutex_unlock(&mu);
    if (e)
        gs_log(GS_LOG_INFO, "launch pacing: %llu launches paced, %llu waited for earlier work, %.3f s waiting in all",
               (unsigned long long)p, (unsigned long long)w, (double)ns / 1e9);
}

/* The child of fork() has none of the parent's contexts (CUDA does not survive fork) and is a new
 * client of the scheduler: no events, no scheduler bound until its own connection sends one, and a
 * driver of its own (what turned pacing off in the parent is for it to find again). */
void gs_pace_atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    for (int i = 0; i < MAX_RINGS; i++)
        rings[i] = (struct ring){0};
    paced = waited = wait_ns = ever = 0;
    atomic_store(&sched_max, 0);
    atomic_store(&pace_off, 0);
    apply();
}
