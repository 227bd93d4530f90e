/*
 * The lock client's state, shared by its parts:
 *   gate.c            the gate: waiting for a grant, connecting, releasing, pass-through, a lost connection
 *   gate_msg.c        the scheduler's messages, and what they set (the launch bound, the idle window)
 *   gate_thread.c     the background thread: reading, idle release, grants and evictions with oversubscription
 *   gate_reconnect.c  reconnection after the scheduler went away, restoring memory without one
 *   gate_fork.c       fork handlers, exit, the exit report
 * Functions named _locked are called with the calling thread's GPU's gate mutex (G->mu) held.
 */
#ifndef GS_GATE_INTERNAL_H
#define GS_GATE_INTERNAL_H

#include <pthread.h>

#include "gpushare_proto.h"
#include "internal.h"

/* CONN_DOWN: the connection ended, or the first connect failed; the background thread (re)connects. */
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
    uint32_t settle_us;      /* release once the work completed and this long passed idle (SETTLE, v7); 0: off */
    int settle_armed;        /* events recorded for the activity settle_act (settle.c) */
    int settle_blind;        /* this hold cannot settle (SETTLE came mid-hold, or a stream it cannot see) */
    uint64_t settle_act;
    uint64_t settles;        /* releases on completion */
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
    int connected_once;      /* a connection came up (the first connect, or a later one after it failed) */
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
extern struct gate gates[GS_DEV_SLOTS];
/* The calling thread's GPU's gate (gs_dev_cur) and its hot words. */
#define G (&gates[gs_dev_cur])
#define H (&gs_hot[gs_dev_cur])
/* Every GPU's gate, on this thread: gs_dev_cur is set for each and put back. */
#define FOR_EACH_GATE(...)                                                                                  \
    do {                                                                                                     \
        int saved_ = gs_dev_cur;                                                                             \
        for (gs_dev_cur = 0; gs_dev_cur < gs_ndevs; gs_dev_cur++) {                                          \
            __VA_ARGS__;                                                                                     \
        }                                                                                                    \
        gs_dev_cur = saved_;                                                                                 \
    } while (0)

/* gate.c */
void gate_cv_init(void);
/* Some of this process's memory is (being) swapped out: the gate must not open onto it. */
int gate_must_restore_locked(void);
/* Pass-through for good (no scheduler at the start, a protocol error, no grant in time, exit). */
void gate_passthrough_locked(const char *reason);
/* The connection ended: the background thread reconnects. */
void gate_lost_locked(const char *reason);
/* A connection is up in gs_conn_version(): liveness and the environment's policy start again. */
void gate_conn_started_locked(void);
/* Waits (bounded) for calls in flight on this GPU to leave the driver; 0 when some stayed. */
int gate_wait_inflight_zero(void);
/* Closes the gate, drains and sends RELEASE; drops mu while draining. */
void gate_release_locked(const char *reason);

/* gate_msg.c */
uint32_t gate_idle_us_locked(void);
void gate_sched_idle_set_locked(uint32_t us, int from_scheduler);
/* The scheduler's settle floor (SETTLE), or 0 when a connection ends (from_scheduler 0). */
void gate_settle_set_locked(uint32_t us, int from_scheduler);
/* The hold ended: nothing launched since, no events armed. */
void gate_settle_reset_locked(void);
/* Reads what fd has and acts on whole messages; -1 once the connection ended. */
int gate_read_input_locked(int fd);

/* gate_thread.c */
void *gate_bg_main(void *arg); /* arg: (fd + 1) << 8 | the GPU's slot; fd -1: connect first */
int gate_bg_start_locked(int fd);
void gate_connect_later_locked(void);
void gate_nap_locked(uint32_t ms);

/* gate_reconnect.c */
int gate_restore_alone_locked(void);
int gate_reconnect_locked(void);

/* gate_fork.c */
void gate_atexit_all(void);

#endif
