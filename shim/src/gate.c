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

_Atomic uint64_t gs_gate_word;
atomic_int gs_gate_open;
atomic_int gs_count_calls;
_Atomic uint64_t gs_calls[GS_HOOK_COUNT];

/* CONN_DOWN: was connected, the connection ended; the background thread reconnects. */
enum { CONN_NEW, CONN_UP, CONN_DOWN, CONN_PASSTHROUGH };

#define TICK_MS 5
#define DRAIN_WAIT_NS (20ull * 1000000ull)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;

static struct {
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
} st = {.fd = -1};

static void cv_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &a);
    pthread_condattr_destroy(&a);
}

/* Some of this process's memory is (being) swapped out: the gate must not open onto it. */
static int must_restore_locked(void)
{
    return atomic_load(&gs_mm_on) && (st.swapping || st.opening || gs_mm_swapped() > 0);
}

/* The idle window in force: the scheduler's when it set one shorter than ours, else ours. A pod's
 * environment may shorten the window, never lengthen the scheduler's (like GPUSHARE_QUANTUM_MS: yield
 * earlier, never later). mu held. */
static uint32_t idle_us_locked(void)
{
    if (st.sched_idle_us != 0 && st.sched_idle_us < gs_cfg.idle_us)
        return st.sched_idle_us;
    return gs_cfg.idle_us;
}

/* The scheduler's idle window (IDLE), or 0 when a connection ends (from_scheduler 0: said nowhere, the
 * window was that scheduler's). mu held. */
static void sched_idle_set_locked(uint32_t us, int from_scheduler)
{
    if (us != 0 && us < GS_IDLE_MIN_US)
        us = GS_IDLE_MIN_US; /* below the kernel's timer slack a shorter window is not kept */
    if (st.sched_idle_us == us)
        return;
    st.sched_idle_us = us;
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
    if (st.conn == CONN_PASSTHROUGH)
        return;
    st.conn = CONN_PASSTHROUGH;
    st.held = 0;
    gs_cap_ledger_stop();
    gs_pace_set(0, 0); /* the bound and the idle window were that scheduler's */
    sched_idle_set_locked(0, 0);
    if (st.fd >= 0)
        shutdown(st.fd, SHUT_RDWR); /* wakes the background thread, which closes it */
    gs_mm_on_reply(0, 0, UINT32_MAX); /* a thread waiting for a MEMREPLY goes on without a budget */
    /* Memory (being) swapped out: the background thread maps it back, then opens the gate. */
    if (!(st.bg_running && must_restore_locked()))
        atomic_store(&gs_gate_open, 1);
    pthread_cond_broadcast(&cv);
    gs_warn_failopen(reason);
}

/* The connection ended (EOF, a failed send, no MEMREPLY in time): the background thread reconnects.
 * Meanwhile the process runs without the lock, unless memory is swapped out (then the gate stays
 * closed until it is back). */
static void lost_locked(const char *reason)
{
    if (st.conn != CONN_UP)
        return;
    st.was_held = st.held || st.opening;
    st.conn = CONN_DOWN;
    st.held = 0;
    st.acquire_sent = 0;
    st.contended = 0;
    st.evict_pending = 0;
    st.lost_ns = gs_now_ns();
    gs_cap_ledger_stop();
    gs_pace_set(0, 0); /* the bound and the idle window were that scheduler's; the next one sends its own */
    sched_idle_set_locked(0, 0);
    if (st.fd >= 0)
        shutdown(st.fd, SHUT_RDWR); /* wakes the background thread, which closes it and reconnects */
    gs_mm_on_reply(0, 0, UINT32_MAX);
    if (must_restore_locked()) {
        atomic_store(&gs_gate_open, 0);
        gs_log(GS_LOG_WARN,
               "the GPU scheduler went away (%s) while %llu bytes of this process's GPU memory are swapped "
               "out: GPU calls wait until that memory is back (reconnecting; after GPUSHARE_RESTORE_WAIT_MS=%u "
               "ms without a scheduler it is restored without a budget)",
               reason, (unsigned long long)gs_mm_swapped(), gs_cfg.restore_wait_ms);
    } else {
        atomic_store(&gs_gate_open, 1);
        gs_log(GS_LOG_WARN, "the GPU scheduler went away (%s): running without the GPU lock while reconnecting",
               reason);
    }
    pthread_cond_broadcast(&cv);
}

static void *bg_main(void *arg);
static void gs_gate_atexit(void);

/* A connection is up in gs_conn_version(): a scheduler of protocol 6 says in POLICY what the pod's
 * environment may change (until then it may change nothing); an older one never will, and the
 * environment holds as before. Liveness counts from the WELCOME. mu held. */
static void conn_started_locked(void)
{
    int v6 = gs_conn_version() >= 6;
    st.heard_ns = v6 ? gs_now_ns() : 0;
    st.ping_ns = 0;
    st.pacing_sent[0] = st.pacing_sent[1] = UINT32_MAX;
    st.policy_known = 0;
    gs_config_env_policy(!v6, 0);
}

static void connect_locked(void)
{
    char why[256];
    if (!gs_cfg.socket_set) {
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
        snprintf(why, sizeof(why), "cannot reach the GPU scheduler at %s", gs_cfg.socket_path);
        passthrough_locked(why);
        return;
    }
    st.fd = fd;
    st.quantum_ms = q;
    st.grace_ms = g;
    st.conn = CONN_UP;
    conn_started_locked();
    gs_mm_configure(w.budget, w.mode);
    gs_cap_ledger_start(fd);

    int err = gs_thread_start(bg_main, (void *)(intptr_t)fd);
    if (err != 0) {
        close(fd);
        st.fd = -1;
        passthrough_locked("cannot start the shim's scheduler thread");
        return;
    }
    st.bg_running = 1;
    gs_log(GS_LOG_INFO, "connected to %s (quantum %u ms, grace %u ms, idle %u us)", gs_cfg.socket_path, q, g,
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
    pthread_once(&cv_once, cv_init);
    for (;;) {
        gs_ctx_record_current();
        pthread_mutex_lock(&mu);
        st.gate_waiters++;
        if (st.conn == CONN_NEW)
            connect_locked();
        uint64_t start = gs_now_ns();
        while (!atomic_load(&gs_gate_open)) {
            if (!st.held && !st.acquire_sent && st.conn == CONN_UP && gs_now_ns() >= st.backoff_until) {
                if (gs_conn_send(st.fd, GS_MSG_ACQUIRE, 0, gs_mm_need()) != 0) {
                    lost_locked("cannot send to the GPU scheduler");
                    break;
                }
                st.acquire_sent = 1;
            }
            uint64_t now = gs_now_ns();
            /* From the start of this wait or the scheduler's last word, whichever is later (heard_ns stays
             * 0 on connections older than protocol 6: their waits count from the start). */
            uint64_t since = st.heard_ns > start ? st.heard_ns : start;
            uint64_t limit = (uint64_t)gs_cfg.wait_timeout_ms * 1000000ull;
            if (limit != 0 && now - since >= limit) {
                passthrough_locked(st.heard_ns != 0 ? "no word from the GPU scheduler within GPUSHARE_WAIT_TIMEOUT_MS "
                                                      "while waiting for the GPU"
                                                    : "no grant within GPUSHARE_WAIT_TIMEOUT_MS");
                break;
            }
            uint64_t nap = 1000000000ull;
            if (!st.held && !st.acquire_sent && st.conn == CONN_UP)
                nap = 10000000ull; /* backing off after a failed swap-in */
            if (limit != 0 && since + limit - now + 1000000ull < nap)
                nap = since + limit - now + 1000000ull; /* wake to look at the timer in time */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + nap;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&cv, &mu, &ts);
        }
        st.gate_waiters--;
        pthread_mutex_unlock(&mu);
        atomic_fetch_add(&gs_gate_word, GS_INFLIGHT_ONE | GS_ACTIVITY_ONE);
        if (atomic_load(&gs_gate_open))
            return;
        atomic_fetch_sub(&gs_gate_word, GS_INFLIGHT_ONE);
    }
}

static int wait_inflight_zero(void)
{
    uint64_t deadline = gs_now_ns() + DRAIN_WAIT_NS;
    for (int spins = 0;; spins++) {
        if ((uint32_t)atomic_load(&gs_gate_word) == 0)
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
    st.releasing = 1;
    atomic_store(&gs_gate_open, 0);
    pthread_mutex_unlock(&mu);
    int ok = wait_inflight_zero() && gs_gpu_drain() == 0;
    pthread_mutex_lock(&mu);
    st.releasing = 0;
    pthread_cond_broadcast(&cv); /* gs_gate_atexit may wait for this */
    if (st.conn != CONN_UP)
        return; /* lost or pass-through meanwhile: the gate is theirs to decide */
    if (!ok) {
        /* A call stayed in the driver or a capture began: keep the lock, retry next tick. */
        atomic_store(&gs_gate_open, 1);
        pthread_cond_broadcast(&cv);
        return;
    }
    if (gs_conn_send(st.fd, GS_MSG_RELEASE, st.epoch, gs_mm_resident()) != 0) {
        lost_locked("cannot send to the GPU scheduler");
        return;
    }
    st.held = 0;
    st.contended = 0;
    st.releases++;
    gs_log(GS_LOG_DEBUG, "released epoch %u (%s)", st.epoch, reason);
    pthread_cond_broadcast(&cv); /* waiting threads now ask again */
}

static void maybe_release_locked(void)
{
    if (!st.held || st.releasing || st.opening)
        return;
    uint64_t now = gs_now_ns();
    uint64_t w = atomic_load(&gs_gate_word);
    uint64_t act = w >> 32;
    /* A paced launch in progress, or a thread that has not yet woken from waiting for this grant, is
     * work about to run: releasing as idle then would hand the GPU on before that work ran. */
    if (act != st.last_act || atomic_load(&gs_pace_busy) != 0 || st.gate_waiters != 0) {
        st.last_act = act;
        st.last_act_ns = now;
    }
    int idle = (uint32_t)w == 0 && now - st.last_act_ns >= (uint64_t)idle_us_locked() * 1000ull;
    int expired = st.contended && now - st.grant_ns >= (uint64_t)st.quantum_ms * 1000000ull;
    if (!idle && !expired)
        return;
    if (gs_capture_active())
        return; /* never synchronize a capturing stream; the scheduler may revoke us */
    release_locked(idle ? "idle" : "quantum used, others waiting");
}

/* After a GRANT with oversubscription: swap in, then open the gate (mu held, dropped meanwhile). */
static void finish_grant_locked(void)
{
    uint32_t epoch = st.epoch;
    st.swapping = 1;
    pthread_mutex_unlock(&mu);
    int r = gs_mm_swap_in_all(0);
    pthread_mutex_lock(&mu);
    st.swapping = 0;
    st.opening = 0;
    if (st.conn != CONN_UP || !st.held || st.epoch != epoch)
        return; /* revoked or disconnected meanwhile */
    uint64_t now = gs_now_ns();
    if (r != 0) {
        /* The memory did not come back (the device is fuller than the budget says, or the
         * working set grew after we asked): give the grant back and ask again shortly. */
        gs_log(GS_LOG_WARN, "could not bring this process's memory back onto the GPU; releasing and retrying");
        if (gs_conn_send(st.fd, GS_MSG_RELEASE, st.epoch, gs_mm_resident()) != 0) {
            lost_locked("cannot send to the GPU scheduler");
            return;
        }
        st.held = 0;
        st.acquire_sent = 0;
        st.backoff_until = now + 50000000ull;
        pthread_cond_broadcast(&cv);
        return;
    }
    st.grant_ns = now;
    st.last_act = atomic_load(&gs_gate_word) >> 32;
    st.last_act_ns = now;
    atomic_store(&gs_gate_open, 1);
    pthread_cond_broadcast(&cv);
}

/* Carries out an EVICT once nothing runs: never while a stream captures (deferred to a later tick). */
static void evict_locked(void)
{
    if (st.held || st.opening || st.releasing)
        return; /* only when we do not hold the GPU; a new grant brings everything back anyway */
    uint64_t target = st.evict_target;
    st.swapping = 1;
    pthread_mutex_unlock(&mu);
    int quiet = wait_inflight_zero() && gs_gpu_drain() == 0;
    if (quiet)
        gs_mm_evict(target); /* answers with USAGE(evicted) */
    pthread_mutex_lock(&mu);
    st.swapping = 0;
    if (quiet && st.evict_target == target)
        st.evict_pending = 0;
    if (!quiet && !st.evict_deferred && gs_capturing())
        gs_log(GS_LOG_DEBUG, "an eviction waits: a stream captures");
    st.evict_deferred = !quiet;
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
        st.held = 1;
        st.acquire_sent = 0;
        st.contended = 0;
        st.epoch = g.epoch;
        st.quantum_ms = g.quantum_ms;
        if (gs_cfg.quantum_ms != 0 && gs_cfg.quantum_ms < st.quantum_ms)
            st.quantum_ms = gs_cfg.quantum_ms;
        st.grant_ns = now;
        st.last_act = atomic_load(&gs_gate_word) >> 32;
        st.last_act_ns = now;
        st.grants++;
        if (gs_conn_version() >= 6 && !st.policy_known) {
            /* POLICY comes right after WELCOME's LEDGER or not at all: none before the first GRANT allows
             * nothing (the agent's scheduler), which is now said once. */
            st.policy_known = 1;
            gs_config_env_policy(0, 1);
        }
        gs_log(GS_LOG_DEBUG, "granted epoch %u (quantum %u ms, reservation %llu)", st.epoch, st.quantum_ms,
               (unsigned long long)g.resident);
        if (atomic_load(&gs_mm_on)) {
            gs_mm_on_reply(1, g.resident, GS_MEM_OK);
            st.opening = 1; /* the background thread swaps in, then opens the gate */
            return;
        }
        atomic_store(&gs_gate_open, 1);
        pthread_cond_broadcast(&cv);
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
        gs_pace_set(p.max_queued, 1);
    } else if (type == GS_MSG_IDLE) {
        /* Like PACE: it holds across grants until the next one; the next tick uses it. */
        struct gs_idle i;
        memcpy(&i, m, sizeof(i));
        sched_idle_set_locked(i.idle_us, 1);
    } else if (type == GS_MSG_POLICY) {
        struct gs_policy p;
        memcpy(&p, m, sizeof(p));
        st.policy_known = 1;
        gs_config_env_policy((p.flags & GS_POLICY_ENV_OVERRIDES) != 0, 1);
        pthread_cond_broadcast(&cv); /* a waiter's timer may be another one now */
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
        st.evict_pending = 1;
        st.evict_target = e.target;
    } else if (type == GS_MSG_LEDGER || type == GS_MSG_CHARGED) {
        gs_cap_on_message(st.fd, m, type);
    } else if (type == GS_MSG_CONTENDED) {
        if (st.held && epoch == st.epoch) {
            st.contended = 1;
            gs_log(GS_LOG_DEBUG, "contended in epoch %u", epoch);
        }
    } else if (type == GS_MSG_REVOKED) {
        if (!st.held || epoch != st.epoch)
            return; /* we released that epoch already */
        st.held = 0;
        st.contended = 0;
        st.acquire_sent = 0;
        atomic_store(&gs_gate_open, 0);
        st.revocations++;
        gs_log(st.revocations == 1 ? GS_LOG_WARN : GS_LOG_DEBUG,
               "GPU lock revoked (held past quantum + grace, or preempted for a production client); work "
               "already queued keeps running, the next GPU call waits for the lock again");
        pthread_cond_broadcast(&cv);
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

/* What the scheduler sent and we have not parsed yet, on the current connection (the background
 * thread reads it: serve, and gs_gate_pump while a swap-in waits for RAISE). */
static unsigned char rbuf[2 * GS_MAX_MSG_SIZE];
static size_t rhave;

/* Reads what fd has and acts on whole messages; -1 once the connection ended (lost, or a protocol
 * error: pass-through). mu held. */
static int read_input_locked(int fd)
{
    ssize_t n = recv(fd, rbuf + rhave, sizeof(rbuf) - rhave, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        lost_locked("its connection ended");
        return -1;
    }
    if (n > 0) {
        rhave += (size_t)n;
        if (gs_conn_version() >= 6)
            st.heard_ns = gs_now_ns(); /* the scheduler answers: a waiter's timer starts again */
        if (handle_input_locked(rbuf, &rhave) != 0) {
            passthrough_locked("protocol error from the GPU scheduler");
            return -1;
        }
    }
    return 0;
}

int gs_gate_pump(int ms)
{
    pthread_mutex_lock(&mu);
    int fd = st.fd;
    int ok = st.conn == CONN_UP && st.held && st.opening;
    pthread_mutex_unlock(&mu);
    if (!ok)
        return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms);
    pthread_mutex_lock(&mu);
    if (r > 0 && st.conn == CONN_UP && st.fd == fd)
        read_input_locked(fd);
    ok = st.conn == CONN_UP && st.held && st.opening;
    pthread_mutex_unlock(&mu);
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
    if (st.held && idle / 4 < us)
        us = idle / 4 > GS_IDLE_MIN_US ? idle / 4 : GS_IDLE_MIN_US;
    return (struct timespec){.tv_sec = 0, .tv_nsec = (long)us * 1000};
}

/* While this process waits for a grant on a connection of protocol 6: PING after a quarter of the wait
 * timeout without a word from the scheduler (at most every second, at least every tick), so that a live
 * scheduler's PONG restarts the timer before it runs out. Whoever answers is alive and serving this GPU's
 * queue: the scheduler answers under the queue's lock. mu held. */
static void ping_locked(int fd)
{
    if (gs_conn_version() < 6 || st.held || !st.acquire_sent || gs_cfg.wait_timeout_ms == 0)
        return;
    uint64_t every = (uint64_t)gs_cfg.wait_timeout_ms * 1000000ull / 4;
    if (every > 1000000000ull)
        every = 1000000000ull;
    uint64_t now = gs_now_ns(), last = st.heard_ns > st.ping_ns ? st.heard_ns : st.ping_ns;
    if (now - last < every)
        return;
    struct gs_ping p;
    memset(&p, 0, sizeof(p));
    p.seq = ++st.ping_seq;
    st.ping_ns = now;
    if (gs_conn_send_raw(fd, &p, GS_MSG_PING, GS_PING_SIZE) != 0)
        lost_locked("cannot send to the GPU scheduler");
}

/* Tells a scheduler of protocol 6 the launch bound in force when it or its source changed (PACING). mu
 * held. */
static void report_pacing_locked(int fd)
{
    if (gs_conn_version() < 6 || st.conn != CONN_UP)
        return;
    uint32_t bound, state;
    gs_pace_state(&bound, &state);
    if (bound == st.pacing_sent[0] && state == st.pacing_sent[1])
        return;
    struct gs_pacing p;
    memset(&p, 0, sizeof(p));
    p.max_queued = bound;
    p.state = state;
    if (gs_conn_send_raw(fd, &p, GS_MSG_PACING, GS_PACING_SIZE) != 0) {
        lost_locked("cannot send to the GPU scheduler");
        return;
    }
    st.pacing_sent[0] = bound;
    st.pacing_sent[1] = state;
}

/* Reads and acts on the scheduler's messages until the connection ends; returns with mu not held. */
static void serve(int fd)
{
    pthread_mutex_lock(&mu);
    rhave = 0;
    struct timespec tick = tick_locked();
    pthread_mutex_unlock(&mu);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = ppoll(&p, 1, &tick, NULL);
        pthread_mutex_lock(&mu);
        if (st.conn != CONN_UP || st.fd != fd) {
            pthread_mutex_unlock(&mu);
            return;
        }
        if (r > 0 && read_input_locked(fd) != 0) {
            pthread_mutex_unlock(&mu);
            return;
        }
        if (st.opening)
            finish_grant_locked();
        if (st.evict_pending)
            evict_locked();
        maybe_release_locked();
        if (st.conn == CONN_UP && st.fd == fd) {
            ping_locked(fd);
            report_pacing_locked(fd);
        }
        tick = tick_locked(); /* for the next wait, while mu is held anyway */
        pthread_mutex_unlock(&mu);
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
    pthread_cond_timedwait(&cv, &mu, &ts);
}

/* Maps every swapped-out allocation back without a budget (no scheduler to ask); opens the gate when
 * nothing is left unmapped. 0 when everything is back. mu held, dropped meanwhile. */
static int restore_alone_locked(void)
{
    st.swapping = 1;
    pthread_mutex_unlock(&mu);
    int r = gs_mm_swap_in_all(1);
    pthread_mutex_lock(&mu);
    st.swapping = 0;
    if (r == 0 && !atomic_load(&gs_gate_open))
        atomic_store(&gs_gate_open, 1);
    pthread_cond_broadcast(&cv);
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
        if (st.conn != CONN_DOWN)
            return -1;
        uint64_t now = gs_now_ns();
        if (!atomic_load(&gs_gate_open)) {
            if (!must_restore_locked()) {
                atomic_store(&gs_gate_open, 1); /* nothing unmapped: run without the lock meanwhile */
                pthread_cond_broadcast(&cv);
            } else if (now - st.lost_ns >= (uint64_t)gs_cfg.restore_wait_ms * 1000000ull) {
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
                if (st.conn != CONN_DOWN)
                    return -1;
            }
        }
        pthread_mutex_unlock(&mu);
        struct gs_welcome w;
        int fd = gs_conn_open(&w);
        pthread_mutex_lock(&mu);
        if (fd >= 0 && st.conn != CONN_DOWN) {
            close(fd);
            return -1;
        }
        if (fd >= 0 && atomic_load(&gs_mm_on) && w.budget == 0) {
            /* Our memory is swappable and needs a budget; this scheduler accounts none. */
            close(fd);
            passthrough_locked("the GPU scheduler came back without a memory budget");
            return -1;
        }
        int quiet = 1;
        if (fd >= 0 && atomic_load(&gs_gate_open)) {
            /* Calls ran without the lock meanwhile: quiesce before taking a place in line again. */
            atomic_store(&gs_gate_open, 0);
            st.releasing = 1;
            pthread_mutex_unlock(&mu);
            quiet = wait_inflight_zero() && gs_gpu_drain() == 0;
            pthread_mutex_lock(&mu);
            st.releasing = 0;
            pthread_cond_broadcast(&cv);
            if (st.conn != CONN_DOWN) {
                close(fd);
                return -1;
            }
            if (!quiet)
                atomic_store(&gs_gate_open, 1); /* busy in the driver or capturing: try again after a backoff */
        }
        if (fd >= 0 && quiet) {
            struct gs_rejoin m;
            memset(&m, 0, sizeof(m));
            m.flags = st.was_held ? GS_REJOIN_HELD : 0;
            uint64_t need, res, swp;
            gs_mm_rejoin(&need, &res, &swp);
            m.need = need;
            m.resident = res;
            m.swapped = swp;
            if (gs_conn_send_raw(fd, &m, GS_MSG_REJOIN, GS_REJOIN_SIZE) == 0) {
                gs_cap_ledger_start(fd); /* its grant announced right behind the REJOIN */
                st.fd = fd;
                st.conn = CONN_UP;
                st.held = 0;
                st.acquire_sent = 0;
                st.contended = 0;
                st.evict_pending = 0;
                st.backoff_until = 0;
                st.quantum_ms = w.quantum_ms;
                st.grace_ms = w.grace_ms;
                st.reconnects++;
                conn_started_locked();
                gs_pace_set(0, 0); /* until this scheduler sends a bound and an idle window of its own */
                sched_idle_set_locked(0, 0);
                gs_log(GS_LOG_WARN,
                       "reconnected to the GPU scheduler after %.1f s; re-announced %llu bytes resident, %llu "
                       "swapped out; GPU calls take the lock again",
                       (double)(gs_now_ns() - st.lost_ns) / 1e9, (unsigned long long)m.resident,
                       (unsigned long long)m.swapped);
                pthread_cond_broadcast(&cv); /* waiting threads ACQUIRE on the new connection */
                return fd;
            }
            if (!must_restore_locked())
                atomic_store(&gs_gate_open, 1);
            pthread_cond_broadcast(&cv);
        }
        if (fd >= 0)
            close(fd);
        nap_locked(backoff);
        backoff = backoff * 2 > gs_cfg.reconnect_max_ms ? gs_cfg.reconnect_max_ms : backoff * 2;
    }
}

static void *bg_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    gs_thread_relax_capture();
    pthread_mutex_lock(&mu);
    while (fd >= 0) {
        pthread_mutex_unlock(&mu);
        serve(fd);
        pthread_mutex_lock(&mu);
        close(fd);
        if (st.fd == fd)
            st.fd = -1;
        fd = st.conn == CONN_DOWN ? reconnect_locked() : -1;
    }
    /* Pass-through for good: never open the gate onto unmapped memory; map it back (without a budget)
     * however long that takes, with a log line now and then. Exit opens the gate regardless. */
    uint64_t fail_logged = 0;
    while (!atomic_load(&gs_gate_open)) {
        if (!must_restore_locked()) {
            atomic_store(&gs_gate_open, 1);
            pthread_cond_broadcast(&cv);
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
    st.bg_running = 0;
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* At exit: let a release or a swap in progress finish, then stop the background
 * thread and pass everything through (the lease ends when the process does). */
static void gs_gate_atexit(void)
{
    pthread_mutex_lock(&mu);
    uint64_t deadline = gs_now_ns() + 1000000000ull;
    while ((st.releasing || st.swapping) && gs_now_ns() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&cv, &mu, &ts);
    }
    if (st.conn == CONN_UP || st.conn == CONN_DOWN) {
        st.conn = CONN_PASSTHROUGH;
        st.held = 0;
        if (st.fd >= 0)
            shutdown(st.fd, SHUT_RDWR);
        atomic_store(&gs_gate_open, 1);
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
}

int gs_gate_send(void *msg, uint16_t type, uint32_t size)
{
    pthread_mutex_lock(&mu);
    int r = -1;
    if (st.conn == CONN_UP && st.fd >= 0)
        r = gs_conn_send_raw(st.fd, msg, type, size);
    pthread_mutex_unlock(&mu);
    return r;
}

void gs_gate_connect(void)
{
    gs_init();
    pthread_once(&cv_once, cv_init);
    pthread_mutex_lock(&mu);
    if (st.conn == CONN_NEW)
        connect_locked();
    pthread_mutex_unlock(&mu);
}

int gs_gate_connected(void)
{
    pthread_mutex_lock(&mu);
    int up = st.conn == CONN_UP;
    pthread_mutex_unlock(&mu);
    return up;
}

void gs_gate_drop(const char *reason)
{
    pthread_mutex_lock(&mu);
    lost_locked(reason);
    pthread_mutex_unlock(&mu);
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
    pthread_once(&cv_once, cv_init);
    pthread_mutex_lock(&mu);
    int done = 1;
    if (st.conn == CONN_UP && st.held && !st.releasing && !st.opening) {
        release_locked("memory growth: the memory is held by others");
        done = !st.held;
    }
    pthread_mutex_unlock(&mu);
    if (!done) {
        struct timespec ts = {0, 1000000}; /* a call in flight or a capture kept the GPU: try again soon */
        nanosleep(&ts, NULL);
    }
}

void gs_gate_atfork_prepare(void)
{
    pthread_mutex_lock(&mu);
}

void gs_gate_atfork_parent(void)
{
    pthread_mutex_unlock(&mu);
}

/* The child of fork() never touches the parent's connection: it closes its copy of the socket and
 * forgets the parent's lease, memory account, reconnection and the idle window its scheduler gave
 * (CUDA does not survive fork, so it has none of the parent's GPU state either). It is a new client of
 * its own, connecting at its first GPU call with its own window until its scheduler sends one, or stays
 * in pass-through if the parent was. The parent's connection and lease are untouched. */
void gs_gate_atfork_child(void)
{
    if (st.fd >= 0)
        close(st.fd);
    st.fd = -1;
    int pass = st.conn == CONN_PASSTHROUGH;
    memset(&st, 0, sizeof(st));
    rhave = 0;
    st.fd = -1;
    st.conn = pass ? CONN_PASSTHROUGH : CONN_NEW;
    atomic_store(&gs_gate_word, 0);
    atomic_store(&gs_gate_open, pass);
    cv_init();
    gs_gpu_atfork_child();
    gs_mm_atfork_child();
    gs_cap_atfork_child();
    gs_pace_atfork_child();
    pthread_mutex_unlock(&mu);
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
    pthread_mutex_lock(&mu);
    unsigned long long g = st.grants, r = st.releases, v = st.revocations;
    pthread_mutex_unlock(&mu);
    gs_log(GS_LOG_DEBUG, "lock grants=%llu releases=%llu revocations=%llu", g, r, v);
}
