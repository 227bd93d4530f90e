/*
 * The client side of the GPU lock: the gate.
 *
 * Application threads pass the gate on every GPU call (gs_gate_enter, an
 * atomic add and a load when the lock is held). Only when the gate is closed
 * do they come here, to connect, send ACQUIRE and sleep until GRANT. A release
 * (gate_release_locked, by the background thread of gate_thread.c) closes
 * the gate, waits for calls in flight, makes the GPU work done
 * (cuCtxSynchronize per context) unless a stream is capturing (then the
 * release is deferred), and sends RELEASE.
 *
 * A scheduler that does not answer the first connect (absent, restarting,
 * slow to WELCOME, at its connection limit) is tried again by the
 * background thread as after a lost connection (gate_reconnect.c): the
 * process runs without the lock only until it answers. One that breaks the
 * protocol once connected opens the gate for good: pass-through with one
 * warning. So does a
 * wait for a grant longer than GPUSHARE_WAIT_TIMEOUT_MS without a word from the
 * scheduler: on a connection of protocol 6 every message restarts that timer,
 * and a waiter asks (PING) after a quarter of it in silence, at most every
 * second, so a scheduler that answers is waited for however long production
 * keeps the GPU; an older scheduler's wait counts from its start. One that
 * goes away after we connected is reconnected (gate_reconnect.c); meanwhile
 * the process runs without the lock, unless memory is swapped out.
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

struct gs_gate_hot gs_hot[GS_DEV_SLOTS];
atomic_int gs_count_calls;
_Atomic uint64_t gs_calls[GS_HOOK_COUNT];

struct gate gates[GS_DEV_SLOTS] = {
    [0 ... GS_DEV_SLOTS - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv_once = PTHREAD_ONCE_INIT, .st = {.fd = -1}},
};

void gate_cv_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&G->cv, &a);
    pthread_condattr_destroy(&a);
}

/* Some of this process's memory is (being) swapped out: the gate must not open onto it. */
int gate_must_restore_locked(void)
{
    return gs_mm_here() && (G->st.swapping || G->st.opening || gs_mm_swapped() > 0);
}

/* Pass-through for good (no scheduler at the start, a protocol error, no grant in time, exit). */
void gate_passthrough_locked(const char *reason)
{
    if (G->st.conn == CONN_PASSTHROUGH)
        return;
    G->st.conn = CONN_PASSTHROUGH;
    G->st.held = 0;
    gs_cap_ledger_stop();
    gs_pace_set(0, 0); /* the bound and the idle window were that scheduler's */
    gate_sched_idle_set_locked(0, 0);
    gate_settle_set_locked(0, 0);
    gs_pace_set_time(0, 0);
    if (G->st.fd >= 0)
        shutdown(G->st.fd, SHUT_RDWR); /* wakes the background thread, which closes it */
    gs_mm_on_reply(0, 0, UINT32_MAX); /* a thread waiting for a MEMREPLY goes on without a budget */
    /* Memory (being) swapped out: the background thread maps it back, then opens the gate. */
    if (!(G->st.bg_running && gate_must_restore_locked()))
        atomic_store(&H->open, 1);
    pthread_cond_broadcast(&G->cv);
    gs_warn_failopen(reason);
}

/* The connection ended (EOF, a failed send, no MEMREPLY in time): the background thread reconnects.
 * Meanwhile the process runs without the lock, unless memory is swapped out (then the gate stays
 * closed until it is back). */
void gate_lost_locked(const char *reason)
{
    if (G->st.conn != CONN_UP)
        return;
    G->st.was_held = G->st.held || G->st.opening;
    G->st.conn = CONN_DOWN;
    G->st.held = 0;
    G->st.acquire_sent = 0;
    G->st.contended = 0;
    G->st.evict_pending = 0;
    G->st.lost_ns = gs_now_ns();
    gs_cap_ledger_away();
    gs_pace_set(0, 0); /* the bound and the idle window were that scheduler's; the next one sends its own */
    gate_sched_idle_set_locked(0, 0);
    gate_settle_set_locked(0, 0);
    gs_pace_set_time(0, 0);
    if (G->st.fd >= 0)
        shutdown(G->st.fd, SHUT_RDWR); /* wakes the background thread, which closes it and reconnects */
    gs_mm_on_reply(0, 0, UINT32_MAX);
    if (gate_must_restore_locked()) {
        atomic_store(&H->open, 0);
        gs_log(GS_LOG_WARN,
               "the GPU scheduler went away (%s) while %llu bytes of this process's GPU memory are swapped "
               "out: GPU calls wait until that memory is back (reconnecting; after GPUSHARE_RESTORE_WAIT_MS=%u "
               "ms without a scheduler it is restored without a budget)",
               reason, (unsigned long long)gs_mm_swapped(), gs_cfg.restore_wait_ms);
    } else {
        atomic_store(&H->open, 1);
        gs_log(GS_LOG_WARN, "the GPU scheduler went away (%s): running without the GPU lock while reconnecting",
               reason);
    }
    pthread_cond_broadcast(&G->cv);
}

/* A connection is up in gs_conn_version(): a scheduler of protocol 6 says in POLICY what the pod's
 * environment may change (until then it may change nothing); an older one never will, and the
 * environment holds as before. Liveness counts from the WELCOME. mu held. */
void gate_conn_started_locked(void)
{
    int v6 = gs_conn_version() >= 6;
    G->st.heard_ns = v6 ? gs_now_ns() : 0;
    G->st.ping_ns = 0;
    G->st.pacing_sent[0] = G->st.pacing_sent[1] = UINT32_MAX;
    G->st.policy_known = 0;
    gs_config_env_policy(!v6, 0);
}

static void connect_locked(void)
{
    if (!gs_devs[gs_dev_cur].socket_set) {
        /* With a memory limit and no scheduler, the limit is the whole job (a sized claim on an MPS
         * GPU: the MPS server shares the GPU, the shim reports and holds the claim's memory). That is
         * configured, not a fault, so it is said once at info level rather than warned about. */
        if (gs_cap_on())
            gs_note_no_lock("GPUSHARE_SOCKET is not set; GPUSHARE_MEMORY_LIMIT_BYTES alone is in force");
        gate_passthrough_locked("GPUSHARE_SOCKET is not set");
        return;
    }
    struct gs_welcome w;
    int fd = gs_conn_open(&w);
    uint32_t q = w.quantum_ms, g = w.grace_ms;
    if (fd < 0) {
        gate_connect_later_locked();
        return;
    }
    G->st.fd = fd;
    G->st.quantum_ms = q;
    G->st.grace_ms = g;
    G->st.conn = CONN_UP;
    gate_conn_started_locked();
    gs_mm_configure(w.budget, w.mode);
    gs_cap_ledger_start(fd);

    if (gate_bg_start_locked(fd) != 0) {
        close(fd);
        G->st.fd = -1;
        gate_passthrough_locked("cannot start the shim's scheduler thread");
        return;
    }
    G->st.connected_once = 1;
    gs_log(GS_LOG_INFO, "connected to %s (quantum %u ms, grace %u ms, idle %u us)", gs_devs[gs_dev_cur].socket_path, q, g,
           gs_cfg.idle_us);
}

/* Starts the GPU's background thread on fd (-1: it connects first, gate_reconnect_locked). 0 or an errno.
 * mu held. */
int gate_bg_start_locked(int fd)
{
    int err = gs_thread_start(gate_bg_main, (void *)(((intptr_t)(fd + 1) << 8) | gs_dev_cur));
    if (err != 0)
        return err;
    G->st.bg_running = 1;
    /* Registered now, after the driver registered its own exit handlers, so
     * ours runs first: the background thread must be out of the driver
     * before the driver tears itself down. */
    static int exit_registered;
    if (!exit_registered) {
        exit_registered = 1;
        atexit(gate_atexit_all);
    }
    return 0;
}

void gs_gate_wait(void)
{
    gs_init();
    pthread_once(&G->cv_once, gate_cv_init);
    for (;;) {
        gs_ctx_record_current();
        pthread_mutex_lock(&G->mu);
        G->st.gate_waiters++;
        if (G->st.conn == CONN_NEW)
            connect_locked();
        uint64_t start = gs_now_ns();
        while (!atomic_load(&H->open)) {
            if (!G->st.held && !G->st.acquire_sent && G->st.conn == CONN_UP && gs_now_ns() >= G->st.backoff_until) {
                if (gs_conn_send(G->st.fd, GS_MSG_ACQUIRE, 0, gs_mm_need()) != 0) {
                    gate_lost_locked("cannot send to the GPU scheduler");
                    break;
                }
                G->st.acquire_sent = 1;
            }
            uint64_t now = gs_now_ns();
            /* From the start of this wait or the scheduler's last word, whichever is later (heard_ns stays
             * 0 on connections older than protocol 6: their waits count from the start). */
            uint64_t since = G->st.heard_ns > start ? G->st.heard_ns : start;
            uint64_t limit = (uint64_t)gs_cfg.wait_timeout_ms * 1000000ull;
            if (limit != 0 && now - since >= limit) {
                gate_passthrough_locked(G->st.heard_ns != 0 ? "no word from the GPU scheduler within GPUSHARE_WAIT_TIMEOUT_MS "
                                                      "while waiting for the GPU"
                                                    : "no grant within GPUSHARE_WAIT_TIMEOUT_MS");
                break;
            }
            uint64_t nap = 1000000000ull;
            if (!G->st.held && !G->st.acquire_sent && G->st.conn == CONN_UP)
                nap = 10000000ull; /* backing off after a failed swap-in */
            if (limit != 0 && since + limit - now + 1000000ull < nap)
                nap = since + limit - now + 1000000ull; /* wake to look at the timer in time */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + nap;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&G->cv, &G->mu, &ts);
        }
        G->st.gate_waiters--;
        pthread_mutex_unlock(&G->mu);
        atomic_fetch_add(&H->word, GS_INFLIGHT_ONE | GS_ACTIVITY_ONE);
        if (atomic_load(&H->open))
            return;
        atomic_fetch_sub(&H->word, GS_INFLIGHT_ONE);
    }
}

int gate_wait_inflight_zero(void)
{
    uint64_t deadline = gs_now_ns() + DRAIN_WAIT_NS;
    for (int spins = 0;; spins++) {
        if ((uint32_t)atomic_load(&H->word) == 0)
            return 1;
        if (gs_now_ns() >= deadline)
            return 0;
        if (spins < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Called with mu held; drops it while draining. */
void gate_release_locked(const char *reason)
{
    G->st.releasing = 1;
    atomic_store(&H->open, 0);
    pthread_mutex_unlock(&G->mu);
    int ok = gate_wait_inflight_zero() && gs_gpu_drain() == 0;
    pthread_mutex_lock(&G->mu);
    G->st.releasing = 0;
    pthread_cond_broadcast(&G->cv); /* gate_atexit_all may wait for this */
    if (G->st.conn != CONN_UP)
        return; /* lost or pass-through meanwhile: the gate is theirs to decide */
    if (!ok) {
        /* A call stayed in the driver or a capture began: keep the lock, retry next tick. */
        atomic_store(&H->open, 1);
        pthread_cond_broadcast(&G->cv);
        return;
    }
    if (gs_conn_send(G->st.fd, GS_MSG_RELEASE, G->st.epoch, gs_mm_resident()) != 0) {
        gate_lost_locked("cannot send to the GPU scheduler");
        return;
    }
    G->st.held = 0;
    G->st.contended = 0;
    G->st.releases++;
    gate_settle_reset_locked();
    gs_log(GS_LOG_DEBUG, "released epoch %u (%s)", G->st.epoch, reason);
    pthread_cond_broadcast(&G->cv); /* waiting threads now ask again */
}

int gs_gate_send(void *msg, uint16_t type, uint32_t size)
{
    pthread_mutex_lock(&G->mu);
    int r = -1;
    if (G->st.conn == CONN_UP && G->st.fd >= 0)
        r = gs_conn_send_raw(G->st.fd, msg, type, size);
    pthread_mutex_unlock(&G->mu);
    return r;
}

void gs_gate_connect(void)
{
    gs_init();
    if (gs_dev_cur == GS_DEV_NONE)
        return;
    pthread_once(&G->cv_once, gate_cv_init);
    pthread_mutex_lock(&G->mu);
    if (G->st.conn == CONN_NEW)
        connect_locked();
    pthread_mutex_unlock(&G->mu);
}

int gs_gate_connected(void)
{
    pthread_mutex_lock(&G->mu);
    int up = G->st.conn == CONN_UP;
    pthread_mutex_unlock(&G->mu);
    return up;
}

void gs_gate_drop(const char *reason)
{
    pthread_mutex_lock(&G->mu);
    gate_lost_locked(reason);
    pthread_mutex_unlock(&G->mu);
}

void gs_gate_yield(void)
{
    pthread_once(&G->cv_once, gate_cv_init);
    pthread_mutex_lock(&G->mu);
    int done = 1;
    if (G->st.conn == CONN_UP && G->st.held && !G->st.releasing && !G->st.opening) {
        gate_release_locked("memory growth: the memory is held by others");
        done = !G->st.held;
    }
    pthread_mutex_unlock(&G->mu);
    if (!done) {
        struct timespec ts = {0, 1000000}; /* a call in flight or a capture kept the GPU: try again soon */
        nanosleep(&ts, NULL);
    }
}
