/*
 * The gate at fork and exit: fork handlers (the child starts as a new client),
 * the exit handler (the background threads out of the driver before it tears
 * itself down), and the exit report of call and lock counts.
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

void gate_atexit_all(void)
{
    FOR_EACH_GATE(gate_atexit());
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
    gate_cv_init();
    gs_cap_atfork_child();
    pthread_mutex_unlock(&G->mu);
}

void gs_gate_atfork_child(void)
{
    FOR_EACH_GATE(gate_atfork_child());
    gs_gpu_atfork_child();
    gs_mm_atfork_child();
    gs_pace_atfork_child();
    gs_settle_atfork_child();
}

void gs_print_call_counts(void)
{
    FOR_EACH_GATE(gs_mm_log_stats());
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
