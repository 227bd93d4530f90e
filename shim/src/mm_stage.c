/*
 * Host staging: where swapped-out memory lives, and the stager thread that page-locks it.
 *
 * Staging is reserved with each allocation (an anonymous mapping asking for transparent huge pages)
 * and page-locked in the background in STAGE_CHUNK pieces, so that neither the allocating thread nor
 * a hand-off pays for pinning: one cuMemHostRegister of a whole 5.75 GiB allocation held the driver,
 * and with it the application's calls, for ~5 s on the H100.
 *
 * What bounds the stager is the kernel faulting the pages in, not the registration: on the H100
 * machine registering faulted-in huge pages ran at 33-38 GB/s, faulting them in at 3.9-7.2 GB/s on
 * one thread and 8-23 GB/s on four (more threads were slower again; 2.3 on a fresh VM's first touch),
 * and a copy into staging not faulted in yet ran at 1-2.6 GB/s (shim/bench/stage_bench.c). So the
 * stager faults a batch of pieces in on up to STAGE_THREADS threads, then registers them one by one
 * (a few ms of driver each), and a swap that reaches a piece not pinned yet waits for it
 * (mm_stage_wait_locked) instead of copying through pageable memory: the copy of piece i runs while
 * piece i+1 is faulted in. A swap's regions go first (urgent). Where pinning fails, or makes no
 * progress for PIN_WAIT_NS, the copy goes through pageable memory: slower, still correct.
 *
 * While a stream of the process captures (gs_capturing), the stager neither page-locks nor
 * unregisters: both are calls the driver refuses during capture, and in global mode a refusal on
 * this thread invalidates the application's capture. It waits for the capture to end (checking the
 * count every CAPTURE_POLL_NS, and the driver for captures that ended unseen), and the staging of
 * memory freed meanwhile is unregistered and unmapped by it afterwards.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "mm_internal.h"

#define STAGE_THREADS 4
#define PIN_WAIT_NS 2000000000ull /* no progress for this long: the swap stops waiting for the stager */
#define CAPTURE_POLL_NS 20000000ull /* while a stream captures, the stager looks again this often */

static pthread_cond_t pin_cv; /* with mm_mu: work for the stager, or a pin finished */
static int stager_started, stager_running;
static int stage_threads = 1;
static uint64_t pinned_bytes, pin_failures, pin_waits, pin_wait_ns;

/* Staging of memory freed while a stream captured: unregistered and unmapped once it ended. */
struct late {
    void *p;
    size_t pinned, size;
};
static struct late *lates;
static int nlate, caplate;
static uint64_t capture_defers; /* times the stager found a capture and waited */

/* pin_cv waits on the monotonic clock (a swap's bounded wait). */
void mm_stage_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&pin_cv, &a);
    pthread_condattr_destroy(&a);
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    stage_threads = cpus < STAGE_THREADS ? (cpus < 1 ? 1 : cpus) : STAGE_THREADS;
}

/* After rep_cv_init (which made pin_cv again): no stager in the child yet. */
void mm_stage_atfork_child(void)
{
    stager_started = 0;
    stager_running = 0;
    pinned_bytes = 0;
    lates = NULL;
    nlate = caplate = 0;
    capture_defers = 0;
}

/* Host staging of size bytes, 2 MiB aligned and asking for transparent huge pages: page-locking
 * huge pages costs the driver a fraction of what 4 KiB pages do. MAP_FAILED when the host has none. */
void *mm_staging_map(size_t size)
{
    const size_t huge = (size_t)2 << 20;
    char *raw = mmap(NULL, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return MAP_FAILED;
    char *p = (char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + huge > p)
        munmap(p + size, (size_t)(raw + huge - p));
    (void)madvise(p, size, MADV_HUGEPAGE);
    return p;
}

/* Whether the host would give one mapping of `size` bytes: the kernel's overcommit check, which an
 * allocation's staging gets when it is one mapping. An allocation staged in segments asks this for the
 * whole first: each segment alone passes the check, and staging the host cannot back kills the process
 * when a swap-out first touches it. Nothing is touched, so this costs two system calls. */
int mm_staging_fits(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    munmap(p, size);
    return 1;
}

/* Unregisters and unmaps r's staging, once the stager is done with it. */
static void unregister_unmap(void *p, size_t pinned, size_t size)
{
    for (size_t off = 0; off < pinned; off += STAGE_CHUNK)
        REAL(cuMemHostUnregister)((char *)p + off);
    munmap(p, size);
}

void mm_stage_release_locked(struct region *r)
{
    pinned_bytes -= r->pin_off;
    if (r->pin_off == 0) {
        munmap(r->staging, r->size);
        return;
    }
    if (gs_unsafe_begin()) {
        unregister_unmap(r->staging, r->pin_off, r->size);
        gs_unsafe_end();
        return;
    }
    /* A stream captures: the stager unregisters it when the capture ended. */
    if (nlate == caplate) {
        int cap = caplate ? caplate * 2 : 16;
        struct late *n = realloc(lates, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            /* Fail open: the page-locked host memory stays until the process exits. */
            gs_log(GS_LOG_WARN, "cannot remember %zu bytes of page-locked staging freed during a stream capture: "
                                "kept until exit", r->pin_off);
            return;
        }
        lates = n;
        caplate = cap;
    }
    lates[nlate++] = (struct late){r->staging, r->pin_off, r->size};
    pthread_cond_broadcast(&pin_cv);
}

/* A swap waiting for the stager releases mm_mu; an application thread that frees meanwhile (calls
 * that do not wait for the GPU: cuMemRelease, cuMemPoolTrimTo) waits for it here. */
void mm_stage_wait_busy_locked(struct region *r)
{
    while (r->pinning || r->swapping)
        pthread_cond_wait(&pin_cv, &mm_mu);
}

void mm_stage_stats_locked(uint64_t *pinned, uint64_t *failures, uint64_t *waits, uint64_t *wait_ns)
{
    *pinned = pinned_bytes;
    *failures = pin_failures;
    *waits = pin_waits;
    *wait_ns = pin_wait_ns;
}

static int pinnable(const struct region *r)
{
    return !r->pinned && !r->pin_failed && !r->pinning;
}

/* Waits until r's staging is page-locked up to end (mm_mu released meanwhile). Returns without it
 * when pinning failed, no stager runs, or the stager made no progress on r for PIN_WAIT_NS. */
void mm_stage_wait_locked(struct region *r, size_t end)
{
    if (r->pin_off >= end || r->pin_failed || !stager_running)
        return;
    uint64_t t0 = gs_now_ns(), last_ns = t0;
    size_t last = r->pin_off;
    r->urgent = 1;
    /* Once per waiting swap piece, not per launch: says the swap waits while it waits (the swap's own
     * line comes after it), which is what a host slow to page-lock shows first. */
    gs_log(GS_LOG_INFO, "swap waits for host staging to be page-locked");
    pthread_cond_broadcast(&pin_cv);
    while (r->pin_off < end && !r->pin_failed) {
        uint64_t dl = last_ns + PIN_WAIT_NS;
        struct timespec ts = {.tv_sec = (time_t)(dl / 1000000000ull), .tv_nsec = (long)(dl % 1000000000ull)};
        int e = pthread_cond_timedwait(&pin_cv, &mm_mu, &ts);
        if (r->pin_off != last) {
            last = r->pin_off;
            last_ns = gs_now_ns();
        } else if (e == ETIMEDOUT) {
            gs_log(GS_LOG_WARN,
                   "host staging was not page-locked within %.1f s: this swap copies through pageable memory",
                   PIN_WAIT_NS / 1e9);
            break;
        }
    }
    pin_waits++;
    pin_wait_ns += gs_now_ns() - t0;
}

/* ---- the stager ---- */

struct piece {
    struct region *r;
    char *p;
    size_t n;
    CUcontext ctx;
};

/* Faults the pages in without holding the driver: cuMemHostRegister then only locks them.
 * MADV_POPULATE_WRITE leaves the contents alone (a swap may already be copying through it); where
 * the kernel lacks it, registering faults the pages in as before. */
static void *populate(void *arg)
{
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    struct piece *pc = arg;
    (void)madvise(pc->p, pc->n, MADV_POPULATE_WRITE);
    return NULL;
}

/* Up to stage_threads pieces, consecutive within each region: a swap's regions first, then the
 * others in address order. Marks their regions busy. */
static int pick_batch_locked(struct piece *b)
{
    int n = 0;
    for (int pass = 0; pass < 2 && n < stage_threads; pass++)
        for (int i = 0; i < mm_nreg && n < stage_threads; i++) {
            struct region *r = mm_regions[i];
            if (!pinnable(r) || (pass == 0 && !r->urgent))
                continue;
            for (size_t off = r->pin_off; off < r->size && n < stage_threads; off += STAGE_CHUNK) {
                size_t len = r->size - off < STAGE_CHUNK ? r->size - off : STAGE_CHUNK;
                b[n++] = (struct piece){r, (char *)r->staging + off, len, r->ctx};
            }
            r->pinning = 1;
        }
    return n;
}

/* Joinable threads that take none of the application's signals. */
static int start_joinable(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}

/* Anything left to page-lock. */
static int has_work_locked(void)
{
    for (int i = 0; i < mm_nreg; i++)
        if (pinnable(mm_regions[i]))
            return 1;
    return 0;
}

/* While a stream captures: sleeps CAPTURE_POLL_NS at a time (a capture's end is not signalled to
 * the stager), dropping captures that ended without cuStreamEndCapture being seen. */
static void wait_capture_locked(void)
{
    gs_log(capture_defers++ == 0 ? GS_LOG_INFO : GS_LOG_DEBUG,
           "a stream captures: page-locking host staging waits until the capture ends");
    while (gs_capturing()) {
        uint64_t dl = gs_now_ns() + CAPTURE_POLL_NS;
        struct timespec ts = {.tv_sec = (time_t)(dl / 1000000000ull), .tv_nsec = (long)(dl % 1000000000ull)};
        pthread_cond_timedwait(&pin_cv, &mm_mu, &ts);
        if (gs_capturing()) {
            pthread_mutex_unlock(&mm_mu); /* gs_capture_active asks the driver: not under mm_mu */
            gs_capture_active();
            pthread_mutex_lock(&mm_mu);
        }
    }
    gs_log(GS_LOG_DEBUG, "stream capture ended: page-locking host staging resumes");
}

static void *stager_main(void *arg)
{
    (void)arg;
    gs_fn_cuCtxPushCurrent_v2 push = REAL(cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = REAL(cuCtxPopCurrent_v2);
    gs_fn_cuMemHostRegister_v2 reg = REAL(cuMemHostRegister_v2);
    struct piece b[STAGE_THREADS];
    gs_thread_relax_capture();
    pthread_mutex_lock(&mm_mu);
    for (;;) {
        if (gs_capturing() && (nlate > 0 || has_work_locked())) {
            wait_capture_locked();
            continue;
        }
        if (nlate > 0) {
            struct late l = lates[--nlate];
            if (!gs_unsafe_begin()) {
                nlate++; /* a capture began meanwhile */
                continue;
            }
            pthread_mutex_unlock(&mm_mu);
            unregister_unmap(l.p, l.pinned, l.size);
            gs_unsafe_end();
            pthread_mutex_lock(&mm_mu);
            continue;
        }
        int n = pick_batch_locked(b);
        if (n == 0) {
            pthread_cond_wait(&pin_cv, &mm_mu);
            continue;
        }
        pthread_mutex_unlock(&mm_mu);
        uint64_t t0 = gs_now_ns();
        pthread_t th[STAGE_THREADS];
        int started[STAGE_THREADS] = {0};
        for (int k = 1; k < n; k++)
            started[k] = start_joinable(&th[k], populate, &b[k]) == 0;
        populate(&b[0]);
        for (int k = 1; k < n; k++) {
            if (started[k])
                pthread_join(th[k], NULL);
            else
                populate(&b[k]);
        }
        CUresult e[STAGE_THREADS];
        for (int k = 0; k < n; k++) {
            e[k] = CUDA_ERROR_NOT_INITIALIZED;
            if (k > 0 && b[k].r == b[k - 1].r && e[k - 1] != CUDA_SUCCESS) {
                e[k] = e[k - 1]; /* a region's pieces are pinned in order, or not at all beyond a failure */
                continue;
            }
            CUcontext c;
            if (!gs_unsafe_begin()) {
                e[k] = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* not tried: pinned after the capture */
                continue;
            }
            if (reg != NULL && push(b[k].ctx) == CUDA_SUCCESS) {
                e[k] = reg(b[k].p, b[k].n, 0);
                pop(&c);
            }
            gs_unsafe_end();
        }
        pthread_mutex_lock(&mm_mu);
        for (int k = 0; k < n; k++) {
            struct region *r = b[k].r;
            r->pinning = 0;
            if (e[k] == CUDA_SUCCESS) {
                if (r->pin_off == 0)
                    r->pin_t0 = t0;
                r->pin_off += b[k].n;
                r->pinned = r->pin_off == r->size;
                pinned_bytes += b[k].n;
                if (r->pinned) {
                    r->urgent = 0;
                    gs_log(GS_LOG_DEBUG, "staging of %zu bytes page-locked in %.3f s", r->size,
                           (gs_now_ns() - r->pin_t0) / 1e9);
                }
            } else if (e[k] == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
                /* not tried (a capture began), or refused by a capture we did not see begin: again later */
            } else if (!r->pin_failed) {
                r->pin_failed = 1;
                r->urgent = 0;
                if (pin_failures++ == 0)
                    gs_log(GS_LOG_WARN,
                           "cannot page-lock %zu bytes of host staging (CUDA error %d): that memory swaps through "
                           "pageable host memory, more slowly",
                           b[k].n, e[k]);
            }
        }
        pthread_cond_broadcast(&pin_cv);
    }
    return NULL;
}

/* A new region has staging to pin: wake the stager, starting it the first time. */
void mm_stage_kick_locked(void)
{
    if (!stager_started) {
        stager_started = 1;
        stager_running = gs_thread_start(stager_main, NULL) == 0;
        if (!stager_running)
            gs_log(GS_LOG_WARN, "cannot start the staging thread: swaps go through pageable host memory");
    }
    pthread_cond_broadcast(&pin_cv);
}
