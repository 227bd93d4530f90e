/*
 * Release on completion (SETTLE, protocol 7): a production process whose scheduler says so releases the
 * lock as soon as the GPU work it submitted has finished and no GPU call came for the floor, instead of
 * keeping the GPU for the whole idle window after its last call. Between two requests an inference
 * server's GPU is idle long before a 1 ms window ends; that part of every gap is the trainer's.
 *
 * The launching threads only note the streams they launch on (one relaxed load per launch while the
 * stream is the last one noted, a mutex and cuCtxGetCurrent when it changes). The gate's background
 * thread, once no call came for the floor, records one event on each stream noted since the last release
 * (in the stream's context, pushed on the background thread) and queries them on its next ticks; when
 * all completed and still no call came, it releases. Its release drains every context as any release
 * does (gate.c), so work on a stream that was not noted (a copy on another stream) is waited for there,
 * never handed over running: the events only decide when.
 *
 * A launch on the per-thread default stream names a stream only its own thread can reach: such a hold
 * settles by the idle window alone, as does one where more than MAX_STREAMS streams were launched on, or
 * an event call failed. Nothing is recorded while a stream captures (gs_unsafe_begin).
 */
#include <pthread.h>
#include <string.h>

#include "internal.h"

#define MAX_STREAMS 8
#define REAL(name) ((gs_fn_##name)gs_real(GS_ID_##name))
#define NONE ((CUstream)(uintptr_t)-1) /* no stream noted (NULL is the legacy default stream) */

struct entry {
    CUcontext ctx; /* NULL: free */
    CUstream s;
    CUevent ev;  /* made on first use in ctx, kept until the context goes */
    int used;    /* launched on since the last release */
    int pending; /* its event was recorded and has not completed */
};

static struct settle {
    pthread_mutex_t mu;
    struct entry e[MAX_STREAMS];
    int blind; /* a stream that cannot be recorded on from another thread, or no room: the window alone */
    _Atomic(CUstream) last;
} st[GS_DEV_SLOTS] = {[0 ... GS_DEV_SLOTS - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER, .last = NONE}};

_Atomic int gs_settle_on[GS_DEV_SLOTS];

void gs_settle_note(CUstream s)
{
    struct settle *z = &st[gs_dev_cur];
    if (atomic_load_explicit(&z->last, memory_order_relaxed) == s)
        return;
    CUcontext ctx = NULL;
    gs_fn_cuCtxGetCurrent current = REAL(cuCtxGetCurrent);
    pthread_mutex_lock(&z->mu);
    if (s == CU_STREAM_PER_THREAD || current == NULL || current(&ctx) != CUDA_SUCCESS || ctx == NULL) {
        z->blind = 1;
    } else {
        struct entry *hit = NULL, *fresh = NULL;
        for (int i = 0; i < MAX_STREAMS; i++) {
            if (z->e[i].ctx == ctx && z->e[i].s == s)
                hit = &z->e[i];
            else if (z->e[i].ctx == NULL && fresh == NULL)
                fresh = &z->e[i];
        }
        if (hit == NULL && fresh != NULL) {
            hit = fresh;
            hit->ctx = ctx;
            hit->s = s;
            hit->ev = NULL;
        }
        if (hit != NULL)
            hit->used = 1;
        else
            z->blind = 1;
    }
    atomic_store_explicit(&z->last, s, memory_order_relaxed);
    pthread_mutex_unlock(&z->mu);
}

int gs_settle_record(void)
{
    struct settle *z = &st[gs_dev_cur];
    gs_fn_cuCtxPushCurrent_v2 push = REAL(cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = REAL(cuCtxPopCurrent_v2);
    if (push == NULL || pop == NULL || REAL(cuEventCreate) == NULL || REAL(cuEventRecord) == NULL ||
        REAL(cuEventQuery) == NULL)
        return -1;
    pthread_mutex_lock(&z->mu);
    int r = z->blind ? -1 : 0;
    /* A launch after this reads its stream again: one on a stream noted before is in the set already. */
    atomic_store_explicit(&z->last, NONE, memory_order_relaxed);
    for (int i = 0; i < MAX_STREAMS && r == 0; i++) {
        struct entry *e = &z->e[i];
        if (e->ctx == NULL || !e->used)
            continue;
        if (!gs_unsafe_begin()) {
            r = -1;
            break;
        }
        if (push(e->ctx) != CUDA_SUCCESS) {
            gs_unsafe_end();
            r = -1;
            break;
        }
        CUresult cr = CUDA_SUCCESS;
        if (e->ev == NULL)
            cr = REAL(cuEventCreate)(&e->ev, CU_EVENT_DISABLE_TIMING);
        if (cr != CUDA_SUCCESS)
            e->ev = NULL;
        else
            cr = REAL(cuEventRecord)(e->ev, e->s);
        CUcontext popped;
        pop(&popped);
        gs_unsafe_end();
        if (cr != CUDA_SUCCESS)
            r = -1;
        e->pending = cr == CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&z->mu);
    return r;
}

int gs_settle_done(void)
{
    struct settle *z = &st[gs_dev_cur];
    pthread_mutex_lock(&z->mu);
    int done = 1;
    for (int i = 0; i < MAX_STREAMS && done; i++) {
        struct entry *e = &z->e[i];
        if (e->ctx == NULL || !e->pending)
            continue;
        if (!gs_unsafe_begin()) {
            done = 0;
            break;
        }
        CUresult r = REAL(cuEventQuery)(e->ev);
        gs_unsafe_end();
        if (r == CUDA_ERROR_NOT_READY)
            done = 0;
        else
            e->pending = 0; /* complete, or an error: the release's drain waits for what is left */
    }
    pthread_mutex_unlock(&z->mu);
    return done;
}

void gs_settle_reset(void)
{
    struct settle *z = &st[gs_dev_cur];
    pthread_mutex_lock(&z->mu);
    for (int i = 0; i < MAX_STREAMS; i++)
        z->e[i].used = z->e[i].pending = 0;
    z->blind = 0;
    atomic_store_explicit(&z->last, NONE, memory_order_relaxed);
    pthread_mutex_unlock(&z->mu);
}

/* Drops the entries of ctx (NULL: every context), destroying their events while the context exists. */
void gs_settle_forget_ctx(CUcontext ctx)
{
    for (int d = 0; d < GS_DEV_SLOTS; d++) {
        struct settle *z = &st[d];
        pthread_mutex_lock(&z->mu);
        for (int i = 0; i < MAX_STREAMS; i++) {
            struct entry *e = &z->e[i];
            if (e->ctx == NULL || (ctx != NULL && e->ctx != ctx))
                continue;
            if (e->ev != NULL && REAL(cuEventDestroy_v2) != NULL && gs_unsafe_begin()) {
                REAL(cuEventDestroy_v2)(e->ev);
                gs_unsafe_end();
            }
            if (e->used || e->pending)
                z->blind = 1; /* what it launched is no longer known: the window decides this hold */
            memset(e, 0, sizeof(*e));
        }
        atomic_store_explicit(&z->last, NONE, memory_order_relaxed);
        pthread_mutex_unlock(&z->mu);
    }
}

void gs_settle_atfork_child(void)
{
    for (int d = 0; d < GS_DEV_SLOTS; d++) {
        pthread_mutex_init(&st[d].mu, NULL);
        memset(st[d].e, 0, sizeof(st[d].e));
        st[d].blind = 0;
        atomic_store(&st[d].last, NONE);
        atomic_store(&gs_settle_on[d], 0);
    }
}
