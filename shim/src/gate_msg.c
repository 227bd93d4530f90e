/*
 * The scheduler's messages, as the background thread reads them (and a swap-in
 * waiting for RAISE, through gs_gate_pump): GRANT / CONTENDED / REVOKED, the
 * memory manager's MEMREPLY / EVICT / RAISE, the claim's ledger (cap.c), and
 * PACE and PACE_TIME (the launch bound of pace.c), IDLE (the scheduler's idle
 * window) and SETTLE (release on completion, settle.c), all of which a
 * connection that ends takes with it.
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

/* The idle window in force: the scheduler's when it set one shorter than ours, else ours. A pod's
 * environment may shorten the window, never lengthen the scheduler's (like GPUSHARE_QUANTUM_MS: yield
 * earlier, never later). mu held. */
uint32_t gate_idle_us_locked(void)
{
    if (G->st.sched_idle_us != 0 && G->st.sched_idle_us < gs_cfg.idle_us)
        return G->st.sched_idle_us;
    return gs_cfg.idle_us;
}

/* The scheduler's idle window (IDLE), or 0 when a connection ends (from_scheduler 0: said nowhere, the
 * window was that scheduler's). mu held. */
void gate_sched_idle_set_locked(uint32_t us, int from_scheduler)
{
    if (us != 0 && us < GS_IDLE_MIN_US)
        us = GS_IDLE_MIN_US; /* below the kernel's timer slack a shorter window is not kept */
    if (G->st.sched_idle_us == us)
        return;
    G->st.sched_idle_us = us;
    if (!from_scheduler)
        return;
    gs_log(GS_LOG_DEBUG, "idle window in force: %u us (the GPU scheduler's: %u us, this process's: %u us)",
           gate_idle_us_locked(), us, gs_cfg.idle_us);
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

/* The scheduler's settle floor (SETTLE), or 0 when a connection ends. Turned on while this process
 * holds the GPU, it applies from the next hold: the streams launched on before it were not noted. mu
 * held. */
void gate_settle_set_locked(uint32_t us, int from_scheduler)
{
    if (G->st.settle_us == us)
        return;
    G->st.settle_us = us;
    atomic_store(&gs_settle_on[gs_dev_cur], us != 0);
    G->st.settle_armed = 0;
    if (us != 0 && G->st.held)
        G->st.settle_blind = 1;
    if (from_scheduler && us != 0)
        gs_log(GS_LOG_INFO,
               "the GPU scheduler asks for a release once this process's GPU work completed and %u us passed "
               "without a GPU call",
               us);
    else if (from_scheduler)
        gs_log(GS_LOG_INFO, "the GPU scheduler asks for no release on completion: the idle window alone");
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
    case GS_MSG_SETTLE:
        return gs_conn_version() >= 7 ? GS_SETTLE_SIZE : 0;
    case GS_MSG_PACE_TIME:
        return gs_conn_version() >= 7 ? GS_PACE_TIME_SIZE : 0;
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
        gs_pace_set(p.max_queued, 1);
    } else if (type == GS_MSG_IDLE) {
        /* Like PACE: it holds across grants until the next one; the next tick uses it. */
        struct gs_idle i;
        memcpy(&i, m, sizeof(i));
        gate_sched_idle_set_locked(i.idle_us, 1);
    } else if (type == GS_MSG_PACE_TIME) {
        struct gs_pace_time p;
        memcpy(&p, m, sizeof(p));
        gs_pace_set_time(p.queue_us, 1);
    } else if (type == GS_MSG_SETTLE) {
        struct gs_settle s;
        memcpy(&s, m, sizeof(s));
        gate_settle_set_locked(s.floor_us, 1);
    } else if (type == GS_MSG_POLICY) {
        struct gs_policy p;
        memcpy(&p, m, sizeof(p));
        G->st.policy_known = 1;
        gs_config_env_policy((p.flags & GS_POLICY_ENV_OVERRIDES) != 0, 1);
        pthread_cond_broadcast(&G->cv); /* a waiter's timer may be another one now */
        gs_cap_policy_changed();
    } else if (type == GS_MSG_PONG) {
        /* Nothing more to do: its arrival restarted the wait timer (gate_read_input_locked). */
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
        gate_settle_reset_locked();
        gs_log(G->st.revocations == 1 ? GS_LOG_WARN : GS_LOG_DEBUG,
               "GPU lock revoked (held past quantum + grace, preempted for a production client, or this "
               "process was stopped while others waited); work already queued keeps running, the next GPU "
               "call waits for the lock again");
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
int gate_read_input_locked(int fd)
{
    ssize_t n = recv(fd, G->rbuf + G->rhave, sizeof(G->rbuf) - G->rhave, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        gate_lost_locked("its connection ended");
        return -1;
    }
    if (n > 0) {
        G->rhave += (size_t)n;
        if (gs_conn_version() >= 6)
            G->st.heard_ns = gs_now_ns(); /* the scheduler answers: a waiter's timer starts again */
        if (handle_input_locked(G->rbuf, &G->rhave) != 0) {
            gate_passthrough_locked("protocol error from the GPU scheduler");
            return -1;
        }
    }
    return 0;
}
