/*
 * The client side of the GPU lock.
 *
 * Application threads pass the gate on every GPU call (gs_gate_enter, an
 * atomic add and a load when the lock is held). Only when the gate is closed
 * do they come here, to connect, send ACQUIRE and sleep until GRANT.
 *
 * One background thread per process owns the socket's read side: it applies
 * GRANT / CONTENDED / REVOKED (and PACE, the launch bound of pace.c, and IDLE,
 * the scheduler's idle window, both of which a connection that ends takes with
 * it) and, every tick, releases the lock when the process went idle (no GPU call
 * for the idle window in force: GPUSHARE_IDLE_US/_MS, or the scheduler's when
 * shorter) or when someone waits and our quantum is used up. A release closes
 * the gate, waits for calls in flight, makes the GPU work done
 * (cuCtxSynchronize per context) unless a stream is capturing (then the
 * release is deferred), and sends RELEASE.
 *
 * A scheduler that is absent at the first GPU call, or that breaks the
 * protocol, opens the gate for good: pass-through with one warning. So does a
 * wait for a grant longer than GPUSHARE_WAIT_TIMEOUT_MS without a word from the
 * scheduler: on a connection of protocol 6 every message restarts that timer,
 * and a waiter asks (PING) after a quarter of it in silence, at most every
 * second, so a scheduler that answers is waited for however long production
 * keeps the GPU; an older scheduler's wait counts from its start. One that
 * goes away after we connected (killed, restarted, its connection lost) is
 * reconnected by the background thread, with backoff; meanwhile the process
 * runs without the lock. On reconnection the thread quiesces the process
 * (gate closed, calls in flight done, GPU work drained), re-announces it with
 * REJOIN (its memory state) and the next GPU call waits in line again.
 * With memory swapped out the gate never opens while any of it is unmapped:
 * it stays closed until a grant of the new scheduler brings the memory back,
 * or, after GPUSHARE_RESTORE_WAIT_MS without one, until it could be restored
 * without a budget (retried, with a log line, for as long as it fails: the
 * host copies stay until then).
 *
 * With oversubscription (mm.c) the same thread also moves memory: after a
 * GRANT it maps and copies the process's swapped-out allocations back in
 * before it opens the gate (a GRANT of part of the need, protocol 3, comes
 * while another process still copies out: the swap-in reads the RAISEs that
 * follow itself, through gs_gate_pump, and maps more with each); on EVICT (only ever sent while we do not hold
 * the GPU) it waits for calls in flight, synchronizes every context (never
 * while a stream captures: the eviction is then deferred, tick after tick,
 * until the capture ends), copies out and releases what was asked, and
 * answers with USAGE. It does both without the gate's mutex, so the
 * application's threads never wait on a copy except at the closed gate.
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

#include "gpushare_proto.h"
#include "internal.h"

struct gs_gate_hot gs_hot[GS_DEV_SLOTS];
atomic_int gs_count_calls;
_Atomic uint64_t gs_calls[GS_HOOK_COUNT];

/* CONN_DOWN: was connected, the connection ended; the background thread reconnects. */
enum { CONN_NEW, CONN_UP, CONN_DOWN, CONN_PASSTHROUGH };

#define TICK_MS 5
#define DRAIN_WAIT_NS (20ull * 1000000ull)

struct gate_state {
    int conn;
    int fd;
    int held;
    int releasing;
    int acquire_sent;
    int contended;
    uint32_t epoch;
    uint32_t quantum_ms;
    uint32_t grace_ms;
    uint64_t grant_ns;
    uint64_t last_act;
    uint64_t last_act_ns;
    int gate_waiters;        /* threads in gs_gate_wait: work waiting for the gate is activity */
    uint64_t grants, releases, revocations;
    uint32_t sched_idle_us;  /* the scheduler's idle window (IDLE, protocol 5); 0: none, ours holds */
    /* oversubscription */
    int opening;             /* granted; swapping in before the gate opens */
    int swapping;            /* the background thread is moving memory */
    int evict_pending;       /* an EVICT to carry out when quiet */
    int evict_deferred;      /* the last attempt found the process busy or capturing (logged once) */
    uint64_t evict_target;
    uint64_t backoff_until;  /* no ACQUIRE before this (after a swap-in that failed) */
    /* restarts */
    int bg_running;          /* the background thread lives: it restores memory and reconnects */
    int was_held;            /* held the GPU when the connection ended (REJOIN says so) */
    uint64_t lost_ns;        /* when the connection ended */
    uint64_t reconnects;
    /* liveness (protocol 6) */
    uint64_t heard_ns;       /* the last message from the scheduler (connections of protocol 6 only) */
    uint64_t ping_ns;        /* the last PING sent */
    uint32_t ping_seq;
    uint32_t pacing_sent[2]; /* the bound and state last reported (PACING); UINT32_MAX: none yet */
    int policy_known;        /* protocol 6: POLICY came, or the first GRANT did without one */
};

/* One gate per shared GPU (dev.c): its lock's state, its connection and its background thread. A
 * process with several GPUs holds each GPU's lock by that GPU's protocol alone. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_once_t cv_once;
    struct gate_state st;
    /* What the scheduler sent and we have not parsed yet, on the current connection (the background
     * thread reads it: serve, and gs_gate_pump while a swap-in waits for RAISE). */
    unsigned char rbuf[2 * GS_MAX_MSG_SIZE];
    size_t rhave;
};
static struct gate gates[GS_DEV_SLOTS] = {
    [0 ... GS_DEV_SLOTS - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv_once = PTHREAD_ONCE_INIT, .st = {.fd = -1}},
};
/* The calling thread's GPU's gate (gs_dev_cur) and its hot words. */
#define G (&gates[gs_dev_cur])
#define H (&gs_hot[gs_dev_cur])

/* The launch bound (pace.c) is the process's: the first GPU that connects sets it. */
static atomic_int pace_owner = -1;
static int pace_mine(void)
{
    int want = -1;
    return atomic_compare_exchange_strong(&pace_owner, &want, gs_dev_cur) || want == gs_dev_cur;
}

static void pace_set(uint32_t max_queued, int from_scheduler)
{
    if (pace_mine())
        gs_pace_set(max_queued, from_scheduler);
}

static void cv_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&G->cv, &a);
    pthread_condattr_destroy(&a);
}

/* Some of this process's memory is (being) swapped out: the gate must not open onto it. */
static int must_restore_locked(void)
{
    return gs_mm_here() && (G->st.swapping || G->st.opening || gs_mm_swapped() > 0);
}

/* The idle window in force: the scheduler's when it set one shorter than ours, else ours. A pod's
 * environment may shorten the window, never lengthen the scheduler's (like GPUSHARE_QUANTUM_MS: yield
 * earlier, never later). mu held. */
static uint32_t idle_us_locked(void)
{
    if (G->st.sched_idle_us != 0 && G->st.sched_idle_us < gs_cfg.idle_us)
        return G->st.sched_idle_us;
    return gs_cfg.idle_us;
}

/* The scheduler's idle window (IDLE), or 0 when a connection ends (from_scheduler 0: said nowhere, the
 * window was that scheduler's). mu held. */
static void sched_idle_set_locked(uint32_t us, int from_scheduler)
{
    if (us != 0 && us < GS_IDLE_MIN_US)
        us = GS_IDLE_MIN_US; /* below the kernel's timer slack a shorter window is not kept */
    if (G->st.sched_idle_us == us)
        return;
    G->st.sched_idle_us = us;
    if (!from_scheduler)
        return;
    gs_log(GS_LOG_DEBUG, "idle window in force: %u us (the GPU scheduler's: %u us, this process's: %u us)",
           idle_us_locked(), us, gs_cfg.idle_us);
    if (us == 0)
        return;
    if (us < gs_cfg.idle_us)
        gs_log(GS_LOG_INFO, "the GPU scheduler asks for an idle release after %u us", us);
    else
        gs_log(GS_LOG_INFO,
               "the GPU scheduler asks for an idle release after %u us; this process's shorter window of %u us "
               "holds",
               us, gs_cfg.idle_us);
}

/* Pass-through for good (no scheduler at the start, a protocol error, no grant in time, exit). */
static void passthrough_locked(const char *reason)
{
    if (G->st.conn == CONN_PASSTHROUGH)
        return;
    G->st.conn = CONN_PASSTHROUGH;
    G->st.held = 0;
    gs_cap_ledger_stop();
    pace_set(0, 0); /* the bound and the idle window were that scheduler's */
    sched_idle_set_locked(0, 0);
    if (G->st.fd >= 0)
        shutdown(G->st.fd, SHUT_RDWR); /* wakes the background thread, which closes it */
    gs_mm_on_reply(0, 0, UINT32_MAX); /* a thread waiting for a MEMREPLY goes on without a budget */
    /* Memory (being) swapped out: the background thread maps it back, then opens the gate. */
    if (!(G->st.bg_running && must_restore_locked()))
        atomic_store(&H->open, 1);
    pthread_cond_broadcast(&G->cv);
    gs_warn_failopen(reason);
}

/* The connection ended (EOF, a failed send, no MEMREPLY in time): the background thread reconnects.
 * Meanwhile the process runs without the lock, unless memory is swapped out (then the gate stays
 * closed until it is back). */
static void lost_locked(const char *reason)
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
    gs_cap_ledger_stop();
    pace_set(0, 0); /* the bound and the idle window were that scheduler's; the next one sends its own */
    sched_idle_set_locked(0, 0);
    if (G->st.fd >= 0)
        shutdown(G->st.fd, SHUT_RDWR); /* wakes the background thread, which closes it and reconnects */
    gs_mm_on_reply(0, 0, UINT32_MAX);
    if (must_restore_locked()) {
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

static void *bg_main(void *arg);
static void gs_gate_atexit(void);

/* A connection is up in gs_conn_version(): a scheduler of protocol 6 says in POLICY what the pod's
 * environment may change (until then it may change nothing); an older one never will, and the
 * environment holds as before. Liveness counts from the WELCOME. mu held. */
static void conn_started_locked(void)
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
    char why[256];
    if (!gs_devs[gs_dev_cur].socket_set) {
        /* With a memory limit and no scheduler, the limit is the whole job (a sized claim on an MPS
         * GPU: the MPS server shares the GPU, the shim reports and holds the claim's memory). That is
         * configured, not a fault, so it is said once at info level rather than warned about. */
        if (gs_cap_on())
            gs_note_no_lock("GPUSHARE_SOCKET is not set; GPUSHARE_MEMORY_LIMIT_BYTES alone is in force");
        passthrough_locked("GPUSHARE_SOCKET is not set");
        return;
    }
    struct gs_welcome w;
    int fd = gs_conn_open(&w);
    uint32_t q = w.quantum_ms, g = w.grace_ms;
    if (fd < 0) {
        snprintf(why, sizeof(why), "cannot reach the GPU scheduler at %s", gs_devs[gs_dev_cur].socket_path);
        passthrough_locked(why);
        return;
    }
    G->st.fd = fd;
    G->st.quantum_ms = q;
    G->st.grace_ms = g;
    G->st.conn = CONN_UP;
    conn_started_locked();
    gs_mm_configure(w.budget, w.mode);
    gs_cap_ledger_start(fd);

    int err = gs_thread_start(bg_main, (void *)(((intptr_t)fd << 8) | gs_dev_cur));
    if (err != 0) {
        close(fd);
        G->st.fd = -1;
        passthrough_locked("cannot start the shim's scheduler thread");
        return;
    }
    G->st.bg_running = 1;
    gs_log(GS_LOG_INFO, "connected to %s (quantum %u ms, grace %u ms, idle %u us)", gs_devs[gs_dev_cur].socket_path, q, g,
           gs_cfg.idle_us);
    /* Registered now, after the driver registered its own exit handlers, so
     * ours runs first: the background thread must be out of the driver
     * before the driver tears itself down. */
    static int exit_registered;
    if (!exit_registered) {
        exit_registered = 1;
        atexit(gs_gate_atexit);
    }
}

void gs_gate_wait(void)
{
    gs_init();
    pthread_once(&G->cv_once, cv_init);
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
                    lost_locked("cannot send to the GPU scheduler");
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
                passthrough_locked(G->st.heard_ns != 0 ? "no word from the GPU scheduler within GPUSHARE_WAIT_TIMEOUT_MS "
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

static int wait_inflight_zero(void)
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
static void release_locked(const char *reason)
{
    G->st.releasing = 1;
    atomic_store(&H->open, 0);
    pthread_mutex_unlock(&G->mu);
    int ok = wait_inflight_zero() && gs_gpu_drain() == 0;
    pthread_mutex_lock(&G->mu);
    G->st.releasing = 0;
    pthread_cond_broadcast(&G->cv); /* gs_gate_atexit may wait for this */
    if (G->st.conn != CONN_UP)
        return; /* lost or pass-through meanwhile: the gate is theirs to decide */
    if (!ok) {
        /* A call stayed in the driver or a capture began: keep the lock, retry next tick. */
        atomic_store(&H->open, 1);
        pthread_cond_broadcast(&G->cv);
        return;
    }
    if (gs_conn_send(G->st.fd, GS_MSG_RELEASE, G->st.epoch, gs_mm_resident()) != 0) {
        lost_locked("cannot send to the GPU scheduler");
        return;
    }
    G->st.held = 0;
    G->st.contended = 0;
    G->st.releases++;
    gs_log(GS_LOG_DEBUG, "released epoch %u (%s)", G->st.epoch, reason);
    pthread_cond_broadcast(&G->cv); /* waiting threads now ask again */
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
    int idle = (uint32_t)w == 0 && now - G->st.last_act_ns >= (uint64_t)idle_us_locked() * 1000ull;
    int expired = G->st.contended && now - G->st.grant_ns >= (uint64_t)G->st.quantum_ms * 1000000ull;
    if (!idle && !expired)
        return;
    if (gs_capture_active())
        return; /* never synchronize a capturing stream; the scheduler may revoke us */
    release_locked(idle ? "idle" : "quantum used, others waiting");
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
            lost_locked("cannot send to the GPU scheduler");
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
    int quiet = wait_inflight_zero() && gs_gpu_drain() == 0;
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

static uint32_t expected_size(uint16_t type)
{
    switch (type) {
    case GS_MSG_GRANT:
        return GS_GRANT_SIZE;
    case GS_MSG_CONTENDED:
        return GS_CONTENDED_SIZE;
    case GS_MSG_REVOKED:
        return GS_REVOKED_SIZE;
    case GS_MSG_MEMREPLY:
        return GS_MEMREPLY_SIZE;
    case GS_MSG_EVICT:
        return GS_EVICT_SIZE;
    case GS_MSG_RAISE:
        return GS_RAISE_SIZE;
    case GS_MSG_PACE:
        return gs_conn_version() >= 4 ? GS_PACE_SIZE : 0;
    case GS_MSG_IDLE:
        return gs_conn_version() >= 5 ? GS_IDLE_SIZE : 0;
    case GS_MSG_PONG:
        return gs_conn_version() >= 6 ? GS_PONG_SIZE : 0;
    case GS_MSG_POLICY:
        return gs_conn_version() >= 6 ? GS_POLICY_SIZE : 0;
    default:
        return gs_cap_msg_size(type, gs_conn_version()); /* the claim's ledger (cap.c) */
    }
}

static void on_message_locked(const unsigned char *m, uint16_t type)
{
    uint32_t epoch;
    memcpy(&epoch, m + GS_HEADER_SIZE, sizeof(epoch));
    if (type == GS_MSG_GRANT) {
        struct gs_grant g;
        memcpy(&g, m, sizeof(g));
        uint64_t now = gs_now_ns();
        G->st.held = 1;
        G->st.acquire_sent = 0;
        G->st.contended = 0;
        G->st.epoch = g.epoch;
        G->st.quantum_ms = g.quantum_ms;
        if (gs_cfg.quantum_ms != 0 && gs_cfg.quantum_ms < G->st.quantum_ms)
            G->st.quantum_ms = gs_cfg.quantum_ms;
        G->st.grant_ns = now;
        G->st.last_act = atomic_load(&H->word) >> 32;
        G->st.last_act_ns = now;
        G->st.grants++;
        if (gs_conn_version() >= 6 && !G->st.policy_known) {
            /* POLICY comes right after WELCOME's LEDGER or not at all: none before the first GRANT allows
             * nothing (the agent's scheduler), which is now said once. */
            G->st.policy_known = 1;
            gs_config_env_policy(0, 1);
        }
        gs_log(GS_LOG_DEBUG, "granted epoch %u (quantum %u ms, reservation %llu)", G->st.epoch, G->st.quantum_ms,
               (unsigned long long)g.resident);
        if (gs_mm_here()) {
            gs_mm_on_reply(1, g.resident, GS_MEM_OK);
            G->st.opening = 1; /* the background thread swaps in, then opens the gate */
            return;
        }
        atomic_store(&H->open, 1);
        pthread_cond_broadcast(&G->cv);
    } else if (type == GS_MSG_RAISE) {
        /* Always applied and counted (the acks must match what the scheduler sent); it only ever comes
         * to the holder filling in after a partial GRANT, before anything that would end that grant. */
        struct gs_raise r;
        memcpy(&r, m, sizeof(r));
        gs_log(GS_LOG_DEBUG, "reservation raised to %llu in epoch %u", (unsigned long long)r.resident, r.epoch);
        gs_mm_on_raise(r.resident);
    } else if (type == GS_MSG_PACE) {
        /* Not tied to an epoch: it holds across grants until the next one. */
        struct gs_pace p;
        memcpy(&p, m, sizeof(p));
        pace_set(p.max_queued, 1);
    } else if (type == GS_MSG_IDLE) {
        /* Like PACE: it holds across grants until the next one; the next tick uses it. */
        struct gs_idle i;
        memcpy(&i, m, sizeof(i));
        sched_idle_set_locked(i.idle_us, 1);
    } else if (type == GS_MSG_POLICY) {
        struct gs_policy p;
        memcpy(&p, m, sizeof(p));
        G->st.policy_known = 1;
        gs_config_env_policy((p.flags & GS_POLICY_ENV_OVERRIDES) != 0, 1);
        pthread_cond_broadcast(&G->cv); /* a waiter's timer may be another one now */
        gs_cap_policy_changed();
    } else if (type == GS_MSG_PONG) {
        /* Nothing more to do: its arrival restarted the wait timer (read_input_locked). */
    } else if (type == GS_MSG_MEMREPLY) {
        struct gs_memreply r;
        memcpy(&r, m, sizeof(r));
        gs_mm_on_reply(r.status == GS_MEM_OK, r.resident, r.status);
    } else if (type == GS_MSG_EVICT) {
        struct gs_evict e;
        memcpy(&e, m, sizeof(e));
        gs_log(GS_LOG_DEBUG, "asked to evict down to %llu bytes", (unsigned long long)e.target);
        G->st.evict_pending = 1;
        G->st.evict_target = e.target;
    } else if (type == GS_MSG_LEDGER || type == GS_MSG_CHARGED) {
        gs_cap_on_message(G->st.fd, m, type);
    } else if (type == GS_MSG_CONTENDED) {
        if (G->st.held && epoch == G->st.epoch) {
            G->st.contended = 1;
            gs_log(GS_LOG_DEBUG, "contended in epoch %u", epoch);
        }
    } else if (type == GS_MSG_REVOKED) {
        if (!G->st.held || epoch != G->st.epoch)
            return; /* we released that epoch already */
        G->st.held = 0;
        G->st.contended = 0;
        G->st.acquire_sent = 0;
        atomic_store(&H->open, 0);
        G->st.revocations++;
        gs_log(G->st.revocations == 1 ? GS_LOG_WARN : GS_LOG_DEBUG,
               "GPU lock revoked (held past quantum + grace, or preempted for a production client); work "
               "already queued keeps running, the next GPU call waits for the lock again");
        pthread_cond_broadcast(&G->cv);
    }
}

/* Parses whole messages out of buf; -1 on anything malformed. */
static int handle_input_locked(unsigned char *buf, size_t *have)
{
    size_t off = 0;
    while (*have - off >= GS_HEADER_SIZE) {
        struct gs_header h;
        memcpy(&h, buf + off, sizeof(h));
        if (h.magic != GS_PROTO_MAGIC || h.version != gs_conn_version())
            return -1;
        uint32_t want = expected_size(h.type);
        if (want == 0 || h.size != want)
            return -1;
        if (*have - off < want)
            break;
        on_message_locked(buf + off, h.type);
        off += want;
    }
    memmove(buf, buf + off, *have - off);
    *have -= off;
    return 0;
}


/* Reads what fd has and acts on whole messages; -1 once the connection ended (lost, or a protocol
 * error: pass-through). mu held. */
static int read_input_locked(int fd)
{
    ssize_t n = recv(fd, G->rbuf + G->rhave, sizeof(G->rbuf) - G->rhave, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        lost_locked("its connection ended");
        return -1;
    }
    if (n > 0) {
        G->rhave += (size_t)n;
        if (gs_conn_version() >= 6)
            G->st.heard_ns = gs_now_ns(); /* the scheduler answers: a waiter's timer starts again */
        if (handle_input_locked(G->rbuf, &G->rhave) != 0) {
            passthrough_locked("protocol error from the GPU scheduler");
            return -1;
        }
    }
    return 0;
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
        read_input_locked(fd);
    ok = G->st.conn == CONN_UP && G->st.held && G->st.opening;
    pthread_mutex_unlock(&G->mu);
    return ok ? 0 : -1;
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
    uint32_t us = TICK_MS * 1000, idle = idle_us_locked();
    if (G->st.held && idle / 4 < us)
        us = idle / 4 > GS_IDLE_MIN_US ? idle / 4 : GS_IDLE_MIN_US;
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
        lost_locked("cannot send to the GPU scheduler");
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
        lost_locked("cannot send to the GPU scheduler");
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
        if (r > 0 && read_input_locked(fd) != 0) {
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
static void nap_locked(uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(&G->cv, &G->mu, &ts);
}

/* Maps every swapped-out allocation back without a budget (no scheduler to ask); opens the gate when
 * nothing is left unmapped. 0 when everything is back. mu held, dropped meanwhile. */
static int restore_alone_locked(void)
{
    G->st.swapping = 1;
    pthread_mutex_unlock(&G->mu);
    int r = gs_mm_swap_in_all(1);
    pthread_mutex_lock(&G->mu);
    G->st.swapping = 0;
    if (r == 0 && !atomic_load(&H->open))
        atomic_store(&H->open, 1);
    pthread_cond_broadcast(&G->cv);
    return r;
}

/* After a lost connection: reconnect with backoff (GPUSHARE_RECONNECT_MAX_MS at most between attempts)
 * and re-announce. Meanwhile the gate is open only when nothing is unmapped; swapped-out memory waits
 * for the new scheduler's grant, or after GPUSHARE_RESTORE_WAIT_MS is restored without a budget.
 * Returns the new connection (CONN_UP, REJOIN sent), or -1 once pass-through is for good. mu held. */
static int reconnect_locked(void)
{
    uint32_t backoff = 20;
    int restore_logged = 0;
    uint64_t fail_logged = 0;
    for (;;) {
        if (G->st.conn != CONN_DOWN)
            return -1;
        uint64_t now = gs_now_ns();
        if (!atomic_load(&H->open)) {
            if (!must_restore_locked()) {
                atomic_store(&H->open, 1); /* nothing unmapped: run without the lock meanwhile */
                pthread_cond_broadcast(&G->cv);
            } else if (now - G->st.lost_ns >= (uint64_t)gs_cfg.restore_wait_ms * 1000000ull) {
                if (!restore_logged) {
                    restore_logged = 1;
                    gs_log(GS_LOG_WARN,
                           "no GPU scheduler for %u ms: restoring %llu bytes of swapped-out GPU memory without "
                           "a budget",
                           gs_cfg.restore_wait_ms, (unsigned long long)gs_mm_swapped());
                }
                if (restore_alone_locked() != 0 && gs_now_ns() - fail_logged >= 10000000000ull) {
                    fail_logged = gs_now_ns();
                    gs_log(GS_LOG_WARN,
                           "could not restore %llu bytes of swapped-out GPU memory (the GPU is full): GPU calls "
                           "keep waiting and the host copies are kept; retrying",
                           (unsigned long long)gs_mm_swapped());
                }
                if (G->st.conn != CONN_DOWN)
                    return -1;
            }
        }
        pthread_mutex_unlock(&G->mu);
        struct gs_welcome w;
        int fd = gs_conn_open(&w);
        pthread_mutex_lock(&G->mu);
        if (fd >= 0 && G->st.conn != CONN_DOWN) {
            close(fd);
            return -1;
        }
        if (fd >= 0 && gs_mm_here() && w.budget == 0) {
            /* Our memory is swappable and needs a budget; this scheduler accounts none. */
            close(fd);
            passthrough_locked("the GPU scheduler came back without a memory budget");
            return -1;
        }
        int quiet = 1;
        if (fd >= 0 && atomic_load(&H->open)) {
            /* Calls ran without the lock meanwhile: quiesce before taking a place in line again. */
            atomic_store(&H->open, 0);
            G->st.releasing = 1;
            pthread_mutex_unlock(&G->mu);
            quiet = wait_inflight_zero() && gs_gpu_drain() == 0;
            pthread_mutex_lock(&G->mu);
            G->st.releasing = 0;
            pthread_cond_broadcast(&G->cv);
            if (G->st.conn != CONN_DOWN) {
                close(fd);
                return -1;
            }
            if (!quiet)
                atomic_store(&H->open, 1); /* busy in the driver or capturing: try again after a backoff */
        }
        if (fd >= 0 && quiet) {
            struct gs_rejoin m;
            memset(&m, 0, sizeof(m));
            m.flags = G->st.was_held ? GS_REJOIN_HELD : 0;
            uint64_t need, res, swp;
            gs_mm_rejoin(&need, &res, &swp);
            m.need = need;
            m.resident = res;
            m.swapped = swp;
            if (gs_conn_send_raw(fd, &m, GS_MSG_REJOIN, GS_REJOIN_SIZE) == 0) {
                gs_cap_ledger_start(fd); /* its grant announced right behind the REJOIN */
                G->st.fd = fd;
                G->st.conn = CONN_UP;
                G->st.held = 0;
                G->st.acquire_sent = 0;
                G->st.contended = 0;
                G->st.evict_pending = 0;
                G->st.backoff_until = 0;
                G->st.quantum_ms = w.quantum_ms;
                G->st.grace_ms = w.grace_ms;
                G->st.reconnects++;
                conn_started_locked();
                pace_set(0, 0); /* until this scheduler sends a bound and an idle window of its own */
                sched_idle_set_locked(0, 0);
                gs_log(GS_LOG_WARN,
                       "reconnected to the GPU scheduler after %.1f s; re-announced %llu bytes resident, %llu "
                       "swapped out; GPU calls take the lock again",
                       (double)(gs_now_ns() - G->st.lost_ns) / 1e9, (unsigned long long)m.resident,
                       (unsigned long long)m.swapped);
                pthread_cond_broadcast(&G->cv); /* waiting threads ACQUIRE on the new connection */
                return fd;
            }
            if (!must_restore_locked())
                atomic_store(&H->open, 1);
            pthread_cond_broadcast(&G->cv);
        }
        if (fd >= 0)
            close(fd);
        nap_locked(backoff);
        backoff = backoff * 2 > gs_cfg.reconnect_max_ms ? gs_cfg.reconnect_max_ms : backoff * 2;
    }
}

static void *bg_main(void *arg)
{
    gs_dev_cur = (int)((intptr_t)arg & 0xff); /* this thread serves one GPU */
    int fd = (int)((intptr_t)arg >> 8);
    gs_thread_relax_capture();
    pthread_mutex_lock(&G->mu);
    while (fd >= 0) {
        pthread_mutex_unlock(&G->mu);
        serve(fd);
        pthread_mutex_lock(&G->mu);
        close(fd);
        if (G->st.fd == fd)
            G->st.fd = -1;
        fd = G->st.conn == CONN_DOWN ? reconnect_locked() : -1;
    }
    /* Pass-through for good: never open the gate onto unmapped memory; map it back (without a budget)
     * however long that takes, with a log line now and then. Exit opens the gate regardless. */
    uint64_t fail_logged = 0;
    while (!atomic_load(&H->open)) {
        if (!must_restore_locked()) {
            atomic_store(&H->open, 1);
            pthread_cond_broadcast(&G->cv);
            break;
        }
        if (restore_alone_locked() == 0)
            break;
        if (gs_now_ns() - fail_logged >= 10000000000ull) {
            fail_logged = gs_now_ns();
            gs_log(GS_LOG_WARN,
                   "could not restore %llu bytes of swapped-out GPU memory (the GPU is full): GPU calls keep "
                   "waiting and the host copies are kept; retrying",
                   (unsigned long long)gs_mm_swapped());
        }
        nap_locked(100);
    }
    G->st.bg_running = 0;
    pthread_mutex_unlock(&G->mu);
    return NULL;
}

/* At exit: let a release or a swap in progress finish, then stop the background
 * thread and pass everything through (the lease ends when the process does). */
static void gate_atexit(void)
{
    pthread_mutex_lock(&G->mu);
    uint64_t deadline = gs_now_ns() + 1000000000ull;
    while ((G->st.releasing || G->st.swapping) && gs_now_ns() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&G->cv, &G->mu, &ts);
    }
    if (G->st.conn == CONN_UP || G->st.conn == CONN_DOWN) {
        G->st.conn = CONN_PASSTHROUGH;
        G->st.held = 0;
        if (G->st.fd >= 0)
            shutdown(G->st.fd, SHUT_RDWR);
        atomic_store(&H->open, 1);
        pthread_cond_broadcast(&G->cv);
    }
    pthread_mutex_unlock(&G->mu);
}

/* Every GPU's gate, on this thread: gs_dev_cur is set for each and put back. */
#define FOR_EACH_GATE(...)                                                                                  \
    do {                                                                                                     \
        int saved_ = gs_dev_cur;                                                                             \
        for (gs_dev_cur = 0; gs_dev_cur < gs_ndevs; gs_dev_cur++) {                                          \
            __VA_ARGS__;                                                                                         \
        }                                                                                                    \
        gs_dev_cur = saved_;                                                                                 \
    } while (0)

static void gs_gate_atexit(void)
{
    FOR_EACH_GATE(gate_atexit());
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
    pthread_once(&G->cv_once, cv_init);
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
    lost_locked(reason);
    pthread_mutex_unlock(&G->mu);
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

void gs_gate_yield(void)
{
    pthread_once(&G->cv_once, cv_init);
    pthread_mutex_lock(&G->mu);
    int done = 1;
    if (G->st.conn == CONN_UP && G->st.held && !G->st.releasing && !G->st.opening) {
        release_locked("memory growth: the memory is held by others");
        done = !G->st.held;
    }
    pthread_mutex_unlock(&G->mu);
    if (!done) {
        struct timespec ts = {0, 1000000}; /* a call in flight or a capture kept the GPU: try again soon */
        nanosleep(&ts, NULL);
    }
}

void gs_gate_atfork_prepare(void)
{
    FOR_EACH_GATE(pthread_mutex_lock(&G->mu));
}

void gs_gate_atfork_parent(void)
{
    FOR_EACH_GATE(pthread_mutex_unlock(&G->mu));
}

/* The child of fork() never touches the parent's connection: it closes its copy of the socket and
 * forgets the parent's lease, memory account, reconnection and the idle window its scheduler gave
 * (CUDA does not survive fork, so it has none of the parent's GPU state either). It is a new client of
 * its own, connecting at its first GPU call with its own window until its scheduler sends one, or stays
 * in pass-through if the parent was. The parent's connection and lease are untouched. */
static void gate_atfork_child(void)
{
    if (G->st.fd >= 0)
        close(G->st.fd);
    G->st.fd = -1;
    int pass = G->st.conn == CONN_PASSTHROUGH;
    memset(&G->st, 0, sizeof(G->st));
    G->rhave = 0;
    G->st.fd = -1;
    G->st.conn = pass ? CONN_PASSTHROUGH : CONN_NEW;
    atomic_store(&H->word, 0);
    atomic_store(&H->open, pass);
    cv_init();
    gs_cap_atfork_child();
    pthread_mutex_unlock(&G->mu);
}

void gs_gate_atfork_child(void)
{
    FOR_EACH_GATE(gate_atfork_child());
    atomic_store(&pace_owner, -1);
    gs_gpu_atfork_child();
    gs_mm_atfork_child();
    gs_pace_atfork_child();
}



void gs_print_call_counts(void)
{
    gs_mm_log_stats();
    gs_pace_log_stats();
    if (!atomic_load(&gs_count_calls))
        return;
    for (int i = 0; i < GS_HOOK_COUNT; i++) {
        uint64_t n = atomic_load(&gs_calls[i]);
        if (n != 0)
            gs_log(GS_LOG_DEBUG, "calls %s=%llu", gs_hook_names[i], (unsigned long long)n);
    }
    FOR_EACH_GATE({
        pthread_mutex_lock(&G->mu);
        unsigned long long g = G->st.grants, r = G->st.releases, v = G->st.revocations;
        pthread_mutex_unlock(&G->mu);
        if (gs_multi)
            gs_log(GS_LOG_DEBUG, "lock %s grants=%llu releases=%llu revocations=%llu", gs_devs[gs_dev_cur].uuid,
                   g, r, v);
        else
            gs_log(GS_LOG_DEBUG, "lock grants=%llu releases=%llu revocations=%llu", g, r, v);
    });
}
