/*
 * A scheduler that goes away after we connected (killed, restarted, its
 * connection lost), or that did not answer the first connect, is
 * (re)connected by the background thread, with backoff;
 * meanwhile the process runs without the lock. On reconnection the thread
 * quiesces the process (gate closed, calls in flight done, GPU work drained),
 * re-announces it with REJOIN (its memory state) and the next GPU call waits
 * in line again. With memory swapped out the gate never opens while any of it
 * is unmapped: it stays closed until a grant of the new scheduler brings the
 * memory back, or, after GPUSHARE_RESTORE_WAIT_MS without one, until it could
 * be restored without a budget (retried, with a log line, for as long as it
 * fails: the host copies stay until then).
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

/* Maps every swapped-out allocation back without a budget (no scheduler to ask); opens the gate when
 * nothing is left unmapped. 0 when everything is back. mu held, dropped meanwhile. */
int gate_restore_alone_locked(void)
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

/* The first connect failed: the scheduler is not there (the agent restarting or rolling out), did not
 * WELCOME within GPUSHARE_CONNECT_TIMEOUT_MS (its pod lookups slow), or refused the connection (the pod at
 * its connection limit). None of that is for good, so the process runs without the lock only until the
 * scheduler answers: the background thread tries again as after a lost connection, and the connection it
 * makes re-announces what the process holds (REJOIN, then its ledger) and takes the lock from the next GPU
 * call on. Oversubscription stays off for the process: memory it allocates meanwhile is plain device
 * memory, which no later budget could swap. mu held. */
void gate_connect_later_locked(void)
{
    G->st.conn = CONN_DOWN;
    G->st.was_held = 0;
    G->st.lost_ns = gs_now_ns();
    atomic_store(&H->open, 1);
    pthread_cond_broadcast(&G->cv);
    if (gate_bg_start_locked(-1) != 0) {
        gate_passthrough_locked("cannot start the shim's scheduler thread");
        return;
    }
    gs_log(GS_LOG_WARN,
           "cannot reach the GPU scheduler at %s: running without the GPU lock%s until it answers (trying again "
           "every %u ms at most)",
           gs_devs[gs_dev_cur].socket_path,
           gs_devs[gs_dev_cur].oversub ? " and without oversubscription" : "", gs_cfg.reconnect_max_ms);
}

/* After a lost connection or a failed first connect: reconnect with backoff (GPUSHARE_RECONNECT_MAX_MS at most between attempts)
 * and re-announce. Meanwhile the gate is open only when nothing is unmapped; swapped-out memory waits
 * for the new scheduler's grant, or after GPUSHARE_RESTORE_WAIT_MS is restored without a budget.
 * Returns the new connection (CONN_UP, REJOIN sent), or -1 once pass-through is for good. mu held. */
int gate_reconnect_locked(void)
{
    uint32_t backoff = 20;
    int restore_logged = 0;
    uint64_t fail_logged = 0;
    for (;;) {
        if (G->st.conn != CONN_DOWN)
            return -1;
        uint64_t now = gs_now_ns();
        if (!atomic_load(&H->open)) {
            if (!gate_must_restore_locked()) {
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
                if (gate_restore_alone_locked() != 0 && gs_now_ns() - fail_logged >= 10000000000ull) {
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
            gate_passthrough_locked("the GPU scheduler came back without a memory budget");
            return -1;
        }
        int quiet = 1;
        if (fd >= 0 && atomic_load(&H->open)) {
            /* Calls ran without the lock meanwhile: quiesce before taking a place in line again. */
            atomic_store(&H->open, 0);
            G->st.releasing = 1;
            pthread_mutex_unlock(&G->mu);
            quiet = gate_wait_inflight_zero() && gs_gpu_drain() == 0;
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
                if (G->st.connected_once)
                    G->st.reconnects++;
                gate_conn_started_locked();
                gs_pace_set(0, 0); /* until this scheduler sends a bound and an idle window of its own */
                gate_sched_idle_set_locked(0, 0);
                gate_settle_set_locked(0, 0);
                gs_pace_set_time(0, 0);
                gs_log(GS_LOG_WARN,
                       "%s to the GPU scheduler after %.1f s; re-announced %llu bytes resident, %llu "
                       "swapped out; GPU calls take the lock %s",
                       G->st.connected_once ? "reconnected" : "connected",
                       (double)(gs_now_ns() - G->st.lost_ns) / 1e9, (unsigned long long)m.resident,
                       (unsigned long long)m.swapped, G->st.connected_once ? "again" : "from now on");
                G->st.connected_once = 1;
                pthread_cond_broadcast(&G->cv); /* waiting threads ACQUIRE on the new connection */
                return fd;
            }
            if (!gate_must_restore_locked())
                atomic_store(&H->open, 1);
            pthread_cond_broadcast(&G->cv);
        }
        if (fd >= 0)
            close(fd);
        gate_nap_locked(backoff);
        backoff = backoff * 2 > gs_cfg.reconnect_max_ms ? gs_cfg.reconnect_max_ms : backoff * 2;
    }
}
