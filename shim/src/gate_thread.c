/*
 * The background thread, one per shared GPU: it owns the socket's read side
 * (gate_msg.c applies what it reads) and, every tick, releases the lock when
 * the process went idle (no GPU call for the idle window in force:
 * GPUSHARE_IDLE_US/_MS, or the scheduler's when shorter) or when someone waits
 * and our quantum is used up.
 *
 * With oversubscription (mm.c) the same thread also moves memory: after a
 * GRANT it maps and copies the process's swapped-out allocations back in
 * before it opens the gate (a GRANT of part of the need, protocol 3, comes
 * while another process still copies out: the swap-in reads the RAISEs that
 * follow itself, through gs_gate_pump, and maps more with each); on EVICT (only
 * ever sent while we do not hold the GPU) it waits for calls in flight,
 * synchronizes every context (never while a stream captures: the eviction is
 * then deferred, tick after tick, until the capture ends), copies out and
 * releases what was asked, and answers with USAGE. It does both without the
 * gate's mutex, so the application's threads never wait on a copy except at
 * the closed gate.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gate_internal.h"

void gate_settle_reset_locked(void)
{
    gs_settle_reset();
    G->st.settle_armed = 0;
    G->st.settle_blind = 0;
}

/* With release on completion: 1 once the work submitted before activity act has completed, its events
 * recorded at the first look (settle.c); 0 while it runs, or when this hold cannot tell (the idle
 * window decides). mu held, no call in flight. */
static int settled_locked(uint64_t act)
{
    if (G->st.settle_blind)
        return 0;
    if (!G->st.settle_armed || G->st.settle_act != act) {
        if (gs_settle_record() != 0) {
            G->st.settle_blind = 1;
            return 0;
        }
        G->st.settle_armed = 1;
        G->st.settle_act = act;
    }
    return gs_settle_done();
}

static void maybe_release_locked(void)
{
    if (!G->st.held || G->st.releasing || G->st.opening)
        return;
    uint64_t now = gs_now_ns();
    uint64_t w = atomic_load(&H->word);
    uint64_t act = w >> 32;
    /* A paced launch in progress, or a thread that has not yet woken from waiting for this grant, is
     * work about to run: releasing as idle then would hand the GPU on before that work ran. */
    if (act != G->st.last_act || atomic_load(&gs_pace_busy) != 0 || G->st.gate_waiters != 0) {
        G->st.last_act = act;
        G->st.last_act_ns = now;
    }
    int idle = (uint32_t)w == 0 && now - G->st.last_act_ns >= (uint64_t)gate_idle_us_locked() * 1000ull;
    int expired = G->st.contended && now - G->st.grant_ns >= (uint64_t)G->st.quantum_ms * 1000000ull;
    /* Release on completion: no call for the floor, and everything launched before has completed (asked
     * past the idle window too, so that the release says which held). */
    int settled = !expired && G->st.settle_us != 0 && (uint32_t)w == 0 &&
                  now - G->st.last_act_ns >= (uint64_t)G->st.settle_us * 1000ull && !gs_capturing() &&
                  settled_locked(act);
    if (!idle && !expired && !settled)
        return;
    if (gs_capture_active())
        return; /* never synchronize a capturing stream; the scheduler may revoke us */
    if (settled)
        G->st.settles++;
    gate_release_locked(settled ? "work completed" : idle ? "idle" : "quantum used, others waiting");
}

/* After a GRANT with oversubscription: swap in, then open the gate (mu held, dropped meanwhile). */
static void finish_grant_locked(void)
{
    uint32_t epoch = G->st.epoch;
    G->st.swapping = 1;
    pthread_mutex_unlock(&G->mu);
    int r = gs_mm_swap_in_all(0);
    pthread_mutex_lock(&G->mu);
    G->st.swapping = 0;
    G->st.opening = 0;
    if (G->st.conn != CONN_UP || !G->st.held || G->st.epoch != epoch)
        return; /* revoked or disconnected meanwhile */
    uint64_t now = gs_now_ns();
    if (r != 0) {
        /* The memory did not come back (the device is fuller than the budget says, or the
         * working set grew after we asked): give the grant back and ask again shortly. */
        gs_log(GS_LOG_WARN, "could not bring this process's memory back onto the GPU; releasing and retrying");
        if (gs_conn_send(G->st.fd, GS_MSG_RELEASE, G->st.epoch, gs_mm_resident()) != 0) {
            gate_lost_locked("cannot send to the GPU scheduler");
            return;
        }
        G->st.held = 0;
        G->st.acquire_sent = 0;
        G->st.backoff_until = now + 50000000ull;
        pthread_cond_broadcast(&G->cv);
        return;
    }
    G->st.grant_ns = now;
    G->st.last_act = atomic_load(&H->word) >> 32;
    G->st.last_act_ns = now;
    atomic_store(&H->open, 1);
    pthread_cond_broadcast(&G->cv);
}

/* Carries out an EVICT once nothing runs: never while a stream captures (deferred to a later tick). */
static void evict_locked(void)
{
    if (G->st.held || G->st.opening || G->st.releasing)
        return; /* only when we do not hold the GPU; a new grant brings everything back anyway */
    uint64_t target = G->st.evict_target;
    G->st.swapping = 1;
    pthread_mutex_unlock(&G->mu);
    int quiet = gate_wait_inflight_zero() && gs_gpu_drain() == 0;
    if (quiet)
        gs_mm_evict(target); /* answers with USAGE(evicted) */
    pthread_mutex_lock(&G->mu);
    G->st.swapping = 0;
    if (quiet && G->st.evict_target == target)
        G->st.evict_pending = 0;
    if (!quiet && !G->st.evict_deferred && gs_capturing())
        gs_log(GS_LOG_DEBUG, "an eviction waits: a stream captures");
    G->st.evict_deferred = !quiet;
}

/* How long the background thread sleeps between checks; mu held. While we hold the GPU, an idle
 * window in force shorter than the tick (the scheduler's for production on GPUs with production
 * classes, whose gaps go to opportunistic work) is checked four times per window: the window counts
 * from the tick that saw the last call, so the GPU is kept at most 1.25 windows past it, where one
 * check per window would keep it up to 2 windows after each of production's requests.
 * Otherwise the tick only retries a deferred eviction, and a short window would only wake the process
 * for nothing. */
static struct timespec tick_locked(void)
{
    uint32_t us = TICK_MS * 1000, idle = gate_idle_us_locked();
    if (G->st.held && idle / 4 < us)
        us = idle / 4 > GS_IDLE_MIN_US ? idle / 4 : GS_IDLE_MIN_US;
    /* Release on completion: a look every half floor, so the GPU goes at most 1.5 floors after the
     * work's end and the last call (and the timer slack). */
    if (G->st.held && G->st.settle_us != 0 && !G->st.settle_blind && G->st.settle_us / 2 < us)
        us = G->st.settle_us / 2 > GS_IDLE_MIN_US ? G->st.settle_us / 2 : GS_IDLE_MIN_US;
    return (struct timespec){.tv_sec = 0, .tv_nsec = (long)us * 1000};
}

/* While this process waits for a grant on a connection of protocol 6: PING after a quarter of the wait
 * timeout without a word from the scheduler (at most every second, at least every tick), so that a live
 * scheduler's PONG restarts the timer before it runs out. Whoever answers is alive and serving this GPU's
 * queue: the scheduler answers under the queue's lock. mu held. */
static void ping_locked(int fd)
{
    if (gs_conn_version() < 6 || G->st.held || !G->st.acquire_sent || gs_cfg.wait_timeout_ms == 0)
        return;
    uint64_t every = (uint64_t)gs_cfg.wait_timeout_ms * 1000000ull / 4;
    if (every > 1000000000ull)
        every = 1000000000ull;
    uint64_t now = gs_now_ns(), last = G->st.heard_ns > G->st.ping_ns ? G->st.heard_ns : G->st.ping_ns;
    if (now - last < every)
        return;
    struct gs_ping p;
    memset(&p, 0, sizeof(p));
    p.seq = ++G->st.ping_seq;
    G->st.ping_ns = now;
    if (gs_conn_send_raw(fd, &p, GS_MSG_PING, GS_PING_SIZE) != 0)
        gate_lost_locked("cannot send to the GPU scheduler");
}

/* Tells a scheduler of protocol 6 the launch bound in force when it or its source changed (PACING). mu
 * held. */
static void report_pacing_locked(int fd)
{
    if (gs_conn_version() < 6 || G->st.conn != CONN_UP)
        return;
    uint32_t bound, state;
    gs_pace_state(&bound, &state);
    if (bound == G->st.pacing_sent[0] && state == G->st.pacing_sent[1])
        return;
    struct gs_pacing p;
    memset(&p, 0, sizeof(p));
    p.max_queued = bound;
    p.state = state;
    if (gs_conn_send_raw(fd, &p, GS_MSG_PACING, GS_PACING_SIZE) != 0) {
        gate_lost_locked("cannot send to the GPU scheduler");
        return;
    }
    G->st.pacing_sent[0] = bound;
    G->st.pacing_sent[1] = state;
}

/* Reads and acts on the scheduler's messages until the connection ends; returns with mu not held. */
static void serve(int fd)
{
    pthread_mutex_lock(&G->mu);
    G->rhave = 0;
    struct timespec tick = tick_locked();
    pthread_mutex_unlock(&G->mu);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = ppoll(&p, 1, &tick, NULL);
        pthread_mutex_lock(&G->mu);
        if (G->st.conn != CONN_UP || G->st.fd != fd) {
            pthread_mutex_unlock(&G->mu);
            return;
        }
        if (r > 0 && gate_read_input_locked(fd) != 0) {
            pthread_mutex_unlock(&G->mu);
            return;
        }
        if (G->st.opening)
            finish_grant_locked();
        if (G->st.evict_pending)
            evict_locked();
        maybe_release_locked();
        if (G->st.conn == CONN_UP && G->st.fd == fd) {
            ping_locked(fd);
            report_pacing_locked(fd);
        }
        tick = tick_locked(); /* for the next wait, while mu is held anyway */
        pthread_mutex_unlock(&G->mu);
    }
}

/* Sleeps up to ms on cv (exit and pass-through wake it); mu held. */
void gate_nap_locked(uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(&G->cv, &G->mu, &ts);
}

void *gate_bg_main(void *arg)
{
    gs_dev_cur = (int)((intptr_t)arg & 0xff); /* this thread serves one GPU */
    int fd = (int)((intptr_t)arg >> 8) - 1;
    gs_thread_relax_capture();
    pthread_mutex_lock(&G->mu);
    if (fd < 0 && G->st.conn == CONN_DOWN)
        fd = gate_reconnect_locked(); /* the first connect failed: keep trying, as after a lost connection */
    while (fd >= 0) {
        pthread_mutex_unlock(&G->mu);
        serve(fd);
        pthread_mutex_lock(&G->mu);
        close(fd);
        if (G->st.fd == fd)
            G->st.fd = -1;
        fd = G->st.conn == CONN_DOWN ? gate_reconnect_locked() : -1;
    }
    /* Pass-through for good: never open the gate onto unmapped memory; map it back (without a budget)
     * however long that takes, with a log line now and then. Exit opens the gate regardless. */
    uint64_t fail_logged = 0;
    while (!atomic_load(&H->open)) {
        if (!gate_must_restore_locked()) {
            atomic_store(&H->open, 1);
            pthread_cond_broadcast(&G->cv);
            break;
        }
        if (gate_restore_alone_locked() == 0)
            break;
        if (gs_now_ns() - fail_logged >= 10000000000ull) {
            fail_logged = gs_now_ns();
            gs_log(GS_LOG_WARN,
                   "could not restore %llu bytes of swapped-out GPU memory (the GPU is full): GPU calls keep "
                   "waiting and the host copies are kept; retrying",
                   (unsigned long long)gs_mm_swapped());
        }
        gate_nap_locked(100);
    }
    G->st.bg_running = 0;
    pthread_mutex_unlock(&G->mu);
    return NULL;
}

int gs_gate_pump(int ms)
{
    pthread_mutex_lock(&G->mu);
    int fd = G->st.fd;
    int ok = G->st.conn == CONN_UP && G->st.held && G->st.opening;
    pthread_mutex_unlock(&G->mu);
    if (!ok)
        return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms);
    pthread_mutex_lock(&G->mu);
    if (r > 0 && G->st.conn == CONN_UP && G->st.fd == fd)
        gate_read_input_locked(fd);
    ok = G->st.conn == CONN_UP && G->st.held && G->st.opening;
    pthread_mutex_unlock(&G->mu);
    return ok ? 0 : -1;
}

int gs_thread_start(void *(*fn)(void *), void *arg)
{
    /* The shim's threads must not take the application's signals: block them all while creating. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}
