/*
 * Wire protocol between the shim (one connection per process) and the
 * per-GPU scheduler (agent/scheduler). The Go side mirrors these numbers in
 * agent/scheduler/proto.go and a test parses this file to keep them equal.
 *
 * Every message starts with gs_header {magic, version, type, size}; size is
 * the whole message in bytes including the header and is fixed per type.
 * All integers are little-endian. A peer that sends a bad magic, version,
 * size or type is disconnected; the shim then runs in pass-through.
 *
 * The lease is the connection: the scheduler frees the lock the moment a
 * holder's socket closes, so a killed process never leaks it.
 *
 * Version 2 adds memory budgets (oversubscription by explicit swap, see
 * docs/oversubscription.md). The scheduler accounts, per client, the bytes of
 * device memory it may have physically resident (its reservation); the sum
 * over the clients of a GPU never exceeds the GPU's budget. A client raises
 * its reservation only through GRANT (to its ACQUIRE need) or MEMREPLY OK (to
 * its MEMREQ need); it lowers it by RELEASE, by USAGE after freeing, and by
 * USAGE(evicted) after an EVICT. USAGE carries the count of raises the client
 * has applied ("acks"), so the scheduler never lowers a reservation on the
 * strength of a report written before a raise it has already sent.
 * A scheduler with budget 0 in WELCOME grants the lock only (version 1
 * behaviour) and every need is 0.
 *
 * Restarts (docs/shim-internals.md, "Scheduler restarts, step by step"): a shim whose connection
 * ends reconnects with backoff and, right after WELCOME, sends REJOIN with
 * its memory state, before anything else. A client's raise count ("acks")
 * starts again at 0 on every connection. A scheduler that finds its socket
 * left by a previous run holds every grant for a bounded rebuild window, so
 * the re-announced memory is accounted before anything is handed out.
 * REJOIN is a new type within version 2: an older scheduler drops a client
 * that sends it, and the shim keeps reconnecting with backoff.
 *
 * Version 3 overlaps the two directions of a hand-off (docs/oversubscription.md,
 * "Overlapped hand-off"). A client carrying out an EVICT reports each release
 * as it goes (USAGE reason progress; USAGE evicted still ends the eviction).
 * The next holder may be granted before all it needs is free, when the
 * evictions under way cover the rest: its GRANT then carries a reservation
 * below its need, and RAISE messages raise it (each counts as a raise for the
 * acks) as the evicted bytes come free. It maps and copies in what its
 * reservation allows while the other process still copies out, and opens its
 * gate (and reports, which starts its quantum) when everything is in.
 * The scheduler serves version 2 clients as before, in version 2 frames (no
 * partial GRANT, no RAISE); a version 3 shim facing a version 2 scheduler is
 * refused at HELLO and passes through.
 *
 * Version 4 bounds an opportunistic client's queue (docs/shim.md, "Launch
 * pacing"; every version: docs/shim-protocol.md). PACE (scheduler to client, sent only to opportunistic clients of
 * version 4 or later: right after WELCOME and whenever the bound changes) says
 * how many kernel and graph launches the client may keep outstanding on the
 * GPU; 0 means unbounded. It is tied to no epoch and holds across grants until
 * the next PACE; a new connection starts unbounded until its scheduler sends
 * one. A preempted client (REVOKED) then leaves the GPU at most that many
 * launches of queued work. The scheduler answers a version 3 client in version
 * 3 frames, without PACE. A version 3 scheduler closes the connection at a
 * version 4 HELLO: the shim then says HELLO again in version 3 and runs
 * without pacing.
 *
 * Version 5 lets the scheduler set a client's idle window (docs/shim.md). IDLE
 * (scheduler to client, sent only to clients of version 5 or later: right after
 * WELCOME when not 0, and whenever it changes, as when a client's class
 * changed) says after how many microseconds without a GPU call the client
 * releases the lock. Production clients get a short window (the agent's
 * scheduler sends 1000 us), so opportunistic work runs in production's gaps; 0
 * means the client's own window. A client keeps the shorter of its own window
 * and the scheduler's. Like PACE it is tied to no epoch and holds until the
 * next IDLE; a new connection starts with the client's own window. The
 * scheduler answers a version 4 client in version 4 frames, without IDLE. A
 * version 4 (or 3) scheduler closes the connection at a version 5 HELLO: the
 * shim then steps down to version 4, and to 3 if that is refused too.
 *
 * Version 6 makes a claim's memory one ledger, waiting behind a live scheduler never a failure, and
 * the launch bound visible (docs/shim-protocol.md; docs/shim.md, "Claim ledger", "Waiting and liveness",
 * "Launch pacing"). A version 6 connection opens with WELCOME, then LEDGER (always), then POLICY (optional),
 * before anything else.
 *
 * The claim ledger: the agent knows each client's pod and the sized claim(s) it holds on this GPU; the
 * clients of the pods that share a claim form one ledger of M bytes (the claim), counted as NVML counts
 * it: each connected process is charged for its CUDA context (the context reserve R until NVML has a
 * figure for the process, then what NVML counts beyond its grant), and their allocations together may
 * reach total = M less those charges. The client connects before it creates its first CUDA context, and
 * the scheduler admits it only while the ledger has room for one more reserve (granted + charges + R <= M). LEDGER (scheduler to client) comes right after WELCOME, always (flags 0: no
 * ledger, the client keeps its own GPUSHARE_MEMORY_LIMIT_BYTES alone; REFUSED: not admitted, the client
 * holds nothing and fails its context creation with out of memory; processes, total and granted then
 * describe the ledger without it), and again whenever the ledger's total or granted bytes change. A client's grant is the part of the total
 * it may allocate without asking; CHARGE asks for at least that many bytes more, CHARGED answers it (the
 * scheduler adds at least a chunk, within the total, or refuses), RETURN gives bytes of the grant back
 * (the client keeps at most a couple of chunks unused). On a new connection the client announces its
 * grant with RETURN flags HOLD right after REJOIN (or after WELCOME's LEDGER on a first connection),
 * before any CHARGE, and a client with a context sends it even with nothing held when its LEDGER says
 * REFUSED: the scheduler admits and accounts it even beyond the total (the context and the memory
 * exist) and refuses everything else until frees bring the ledger back within it. A LEDGER with ON that
 * reaches a client outside any ledger (its pod was found after it connected) is answered the same way. A client's grant returns to the
 * ledger when its connection ends. Version 5 and older clients count in n and keep their per-process
 * limit.
 *
 * Liveness: a client that waits for a GRANT sends PING now and then (after a quarter of its
 * GPUSHARE_WAIT_TIMEOUT_MS without a message, at most every second); the scheduler answers PONG under
 * the GPU's queue lock, so a wedged queue does not answer. Any message from the scheduler restarts the
 * client's wait timer: the client passes through only after that long without a word.
 *
 * The environment's policy: POLICY (right after LEDGER; a scheduler that allows nothing need not send
 * it) says what the pod's environment may change: without GS_POLICY_ENV_OVERRIDES the client ignores
 * the environment settings that would weaken its pacing or its wait (GPUSHARE_PACE_OVERRIDE,
 * GPUSHARE_PACE_FULL_US, GPUSHARE_PACE_WAIT_MAX_MS, GPUSHARE_WAIT_TIMEOUT_MS and
 * GPUSHARE_MEMREPLY_TIMEOUT_MS take their defaults). PACING (client to scheduler) reports the launch
 * bound in force and why, whenever either changes.
 *
 * The scheduler serves version 5 and older clients in their version. A version 5 scheduler closes the
 * connection at a version 6 HELLO: the shim steps down as above and keeps that version's behaviour (its
 * per-process memory limit, a wait timer that counts from the start of the wait, the environment's
 * settings).
 *
 * Version 7 ties production's release to its work and the opportunistic bound to GPU time (docs/qos.md,
 * docs/shim.md "Launch pacing"). SETTLE (scheduler to client, sent like IDLE: only to production clients
 * while an opportunistic client is busy, and whenever it changes) says: release the lock as soon as the GPU
 * work this process submitted has completed and floor_us passed without a GPU call, instead of waiting for
 * the idle window (which still holds as the latest release); 0 turns it off. PACE_TIME (scheduler to
 * client, sent with PACE) bounds the opportunistic client's queue in GPU time: at most queue_us of
 * estimated run time outstanding (a launch alone may exceed it); 0 leaves PACE's count bound. Both are
 * tied to no epoch and hold until the next; a new connection starts without them. The scheduler answers a
 * version 6 client in version 6 frames, without them; a version 6 scheduler closes the connection at a
 * version 7 HELLO and the shim steps down.
 */
#ifndef GPUSHARE_PROTO_H
#define GPUSHARE_PROTO_H

#include <stdint.h>

#define GS_PROTO_MAGIC 0x48535047u /* bytes "GPSH" */
#define GS_PROTO_VERSION 7u
#define GS_PROTO_MIN_VERSION 2u /* the oldest client version the scheduler serves */
#define GS_MAX_MSG_SIZE 256u
#define GS_UUID_LEN 64u

/* Message types. c->s: client to scheduler, s->c: scheduler to client. */
#define GS_MSG_HELLO 1u     /* c->s first message: pid, priority, GPU uuid */
#define GS_MSG_WELCOME 2u   /* s->c answer to HELLO: client id, quantum, grace, budget, mode */
#define GS_MSG_ACQUIRE 3u   /* c->s: wants the GPU with need bytes resident */
#define GS_MSG_GRANT 4u     /* s->c: the GPU is yours for epoch, quantum; reservation = resident */
#define GS_MSG_RELEASE 5u   /* c->s: done with epoch, GPU work drained; keeps resident bytes */
#define GS_MSG_CONTENDED 6u /* s->c: someone waits; release once quantum is used */
#define GS_MSG_REVOKED 7u   /* s->c: held past quantum + grace; epoch is void */
#define GS_MSG_MEMREQ 8u    /* c->s: holder wants its reservation raised to need */
#define GS_MSG_MEMREPLY 9u  /* s->c: answer to MEMREQ: status, reservation */
#define GS_MSG_EVICT 10u    /* s->c: non-holder, bring your resident bytes down to target */
#define GS_MSG_USAGE 11u    /* c->s: memory state and swap counters (reason: report / evicted) */
#define GS_MSG_REJOIN 12u   /* c->s: right after WELCOME on a reconnection: memory state to account */
#define GS_MSG_RAISE 13u    /* s->c (v3): a holder filling in after a partial GRANT: reservation raised */
#define GS_MSG_PACE 14u     /* s->c (v4): keep at most max_queued launches outstanding; 0: unbounded */
#define GS_MSG_IDLE 15u     /* s->c (v5): release after idle_us microseconds without a GPU call; 0: own window */
#define GS_MSG_LEDGER 16u   /* s->c (v6): the claim's ledger: after WELCOME, and whenever it changes */
#define GS_MSG_CHARGE 17u   /* c->s (v6): raise my grant by at least bytes */
#define GS_MSG_CHARGED 18u  /* s->c (v6): answer to CHARGE: status, bytes added, the ledger */
#define GS_MSG_RETURN 19u   /* c->s (v6): give bytes of my grant back; flags HOLD: my grant is bytes */
#define GS_MSG_PING 20u     /* c->s (v6): a waiter asks whether the scheduler still answers */
#define GS_MSG_PONG 21u     /* s->c (v6): the answer to PING (its seq) */
#define GS_MSG_POLICY 22u   /* s->c (v6): right after WELCOME's LEDGER: GS_POLICY_* flags */
#define GS_MSG_PACING 23u   /* c->s (v6): the launch bound in force and its GS_PACING_* state */
#define GS_MSG_SETTLE 24u   /* s->c (v7): release once the submitted work completed and floor_us passed idle; 0: off */
#define GS_MSG_PACE_TIME 25u /* s->c (v7): keep at most queue_us of GPU time outstanding; 0: PACE's count */

/* Anti-thrashing modes (WELCOME.mode). */
#define GS_MODE_AUTO 0u   /* concurrent while the working sets fit the budget together */
#define GS_MODE_ALWAYS 1u /* one holder at a time, always */
#define GS_MODE_OFF 2u    /* never serialize; memory beyond the budget fails to allocate */

/* MEMREPLY.status */
#define GS_MEM_OK 0u        /* reservation raised to need */
#define GS_MEM_BUSY 1u      /* others hold the memory: release the GPU and ACQUIRE with the larger need */
#define GS_MEM_TOO_LARGE 2u /* can never fit (beyond the budget, or mode Off and not free now) */

/* USAGE.reason */
#define GS_USAGE_REPORT 0u
#define GS_USAGE_EVICTED 1u /* answers an EVICT: the eviction is done (or gave up) */
#define GS_USAGE_PROGRESS 2u /* (v3) an eviction under way: resident bytes so far; it goes on */

/* REJOIN.flags */
#define GS_REJOIN_HELD 1u /* it held the GPU when the previous connection ended */

/* LEDGER.flags */
#define GS_LEDGER_ON 1u      /* this client's allocations are charged to a claim's ledger */
#define GS_LEDGER_REFUSED 2u /* the claim has no room for this client's context: it may not create one */

/* CHARGED.status */
#define GS_CHARGE_OK 0u      /* added bytes were added to the grant */
#define GS_CHARGE_REFUSED 1u /* the ledger cannot give that much: fail the allocation */

/* RETURN.flags */
#define GS_RETURN_HOLD 1u /* on a new connection: the grant this client holds (once, before any CHARGE) */

/* POLICY.flags */
#define GS_POLICY_ENV_OVERRIDES 1u /* the pod's environment may weaken pacing and waits (benchmarks) */

/* PACING.state: where the bound in force comes from */
#define GS_PACING_SCHEDULER 0u /* the scheduler's PACE (0: unbounded) */
#define GS_PACING_OVERRIDE 1u  /* GPUSHARE_PACE_OVERRIDE, which the scheduler allowed */
#define GS_PACING_BACKOFF 2u   /* off after a stall or a driver error; re-armed after a back-off */
#define GS_PACING_OFF 3u       /* off for good: the driver lacks the event calls pacing needs */

#define GS_PRIORITY_NORMAL 0u
#define GS_PRIORITY_HIGH 1u

/* Fixed message sizes in bytes, header included. */
#define GS_HEADER_SIZE 12u
#define GS_HELLO_SIZE 84u
#define GS_WELCOME_SIZE 36u
#define GS_ACQUIRE_SIZE 20u
#define GS_GRANT_SIZE 28u
#define GS_RELEASE_SIZE 28u
#define GS_CONTENDED_SIZE 20u
#define GS_REVOKED_SIZE 16u
#define GS_MEMREQ_SIZE 20u
#define GS_MEMREPLY_SIZE 28u
#define GS_EVICT_SIZE 24u
#define GS_USAGE_SIZE 84u
#define GS_REJOIN_SIZE 44u
#define GS_RAISE_SIZE 28u
#define GS_PACE_SIZE 16u
#define GS_IDLE_SIZE 16u
#define GS_LEDGER_SIZE 68u
#define GS_CHARGE_SIZE 28u
#define GS_CHARGED_SIZE 52u
#define GS_RETURN_SIZE 28u
#define GS_PING_SIZE 16u
#define GS_PONG_SIZE 16u
#define GS_POLICY_SIZE 16u
#define GS_PACING_SIZE 20u
#define GS_SETTLE_SIZE 16u
#define GS_PACE_TIME_SIZE 16u

struct gs_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t size;
};

struct gs_hello {
    struct gs_header h;
    uint32_t pid;
    uint32_t priority;
    char gpu_uuid[GS_UUID_LEN]; /* NUL-padded; empty = whatever GPU this socket serves */
};

struct gs_welcome {
    struct gs_header h;
    uint32_t client_id;
    uint32_t quantum_ms;
    uint32_t grace_ms;
    uint32_t mode;   /* GS_MODE_* */
    uint64_t budget; /* bytes of device memory for all clients of this GPU; 0: lock only */
} __attribute__((packed));

struct gs_acquire {
    struct gs_header h;
    uint64_t need; /* bytes that must be resident to run (the whole working set) */
} __attribute__((packed));

struct gs_grant {
    struct gs_header h;
    uint32_t epoch;
    uint32_t quantum_ms;
    uint64_t resident; /* the client's reservation from now on (>= its need) */
} __attribute__((packed));

struct gs_release {
    struct gs_header h;
    uint32_t epoch;
    uint32_t pad;
    uint64_t resident; /* bytes it keeps resident */
} __attribute__((packed));

struct gs_contended {
    struct gs_header h;
    uint32_t epoch;
    uint32_t waiters;
};

struct gs_revoked {
    struct gs_header h;
    uint32_t epoch;
};

struct gs_memreq {
    struct gs_header h;
    uint64_t need;
} __attribute__((packed));

struct gs_memreply {
    struct gs_header h;
    uint32_t status; /* GS_MEM_* */
    uint32_t pad;
    uint64_t resident; /* the reservation after this answer */
} __attribute__((packed));

struct gs_evict {
    struct gs_header h;
    uint32_t pad;
    uint64_t target; /* bring resident bytes down to at most this */
} __attribute__((packed));

struct gs_usage {
    struct gs_header h;
    uint32_t reason; /* GS_USAGE_* */
    uint32_t acks;   /* GRANTs and MEMREPLY OKs applied so far */
    uint64_t need;   /* working set: bytes of all swappable allocations */
    uint64_t resident;
    uint64_t swapped;
    uint64_t swap_outs; /* allocations copied out and released */
    uint64_t swap_ins;  /* allocations mapped and copied back */
    uint64_t bytes_out;
    uint64_t bytes_in;
    uint64_t swap_ns; /* time spent swapping */
} __attribute__((packed));

struct gs_rejoin {
    struct gs_header h;
    uint32_t flags; /* GS_REJOIN_* */
    uint32_t pad;
    uint64_t need;     /* working set: bytes of all swappable allocations */
    uint64_t resident; /* physically mapped now: the scheduler accounts it as the reservation */
    uint64_t swapped;  /* in host staging */
} __attribute__((packed));

struct gs_raise {
    struct gs_header h;
    uint32_t epoch;
    uint32_t pad;
    uint64_t resident; /* the reservation from now on */
} __attribute__((packed));

struct gs_pace {
    struct gs_header h;
    uint32_t max_queued; /* kernel and graph launches outstanding on the GPU at most; 0: unbounded */
} __attribute__((packed));

struct gs_idle {
    struct gs_header h;
    uint32_t idle_us; /* release after this long without a GPU call; 0: the client's own window */
} __attribute__((packed));

struct gs_ledger {
    struct gs_header h;
    uint32_t flags;     /* GS_LEDGER_* */
    uint32_t processes; /* n: the ledger's connected processes on this GPU, this one included */
    uint64_t claim;     /* M: the claim's bytes, as NVML counts them (contexts included) */
    uint64_t reserve;   /* this process's context charge (R before NVML measured it); REFUSED: R */
    uint64_t total;     /* M less the context charges (0 when negative): what the allocations may reach */
    uint64_t granted;   /* the grants of all the ledger's processes, this one's included */
    uint64_t grant;     /* this client's grant */
    uint64_t chunk;     /* a CHARGE adds at least this while there is room; keep at most two unused */
} __attribute__((packed));

struct gs_charge {
    struct gs_header h;
    uint32_t seq; /* echoed in CHARGED */
    uint32_t pad;
    uint64_t bytes; /* at least this many more */
} __attribute__((packed));

struct gs_charged {
    struct gs_header h;
    uint32_t seq;
    uint32_t status; /* GS_CHARGE_* */
    uint64_t added;  /* bytes added to the grant (0 when refused) */
    uint64_t grant;  /* this client's grant now */
    uint64_t total;  /* as in LEDGER */
    uint64_t granted;
} __attribute__((packed));

struct gs_return {
    struct gs_header h;
    uint32_t flags; /* GS_RETURN_* */
    uint32_t pad;
    uint64_t bytes; /* given back; with HOLD: the grant held */
} __attribute__((packed));

struct gs_ping { /* PING and PONG */
    struct gs_header h;
    uint32_t seq; /* PONG: the PING's */
} __attribute__((packed));

struct gs_policy {
    struct gs_header h;
    uint32_t flags; /* GS_POLICY_* */
} __attribute__((packed));

struct gs_pacing {
    struct gs_header h;
    uint32_t max_queued; /* the bound in force; 0: unbounded */
    uint32_t state;      /* GS_PACING_* */
} __attribute__((packed));

struct gs_settle {
    struct gs_header h;
    uint32_t floor_us; /* release once the submitted work completed and this long passed without a GPU call; 0: off */
} __attribute__((packed));

struct gs_pace_time {
    struct gs_header h;
    uint32_t queue_us; /* estimated GPU time outstanding at most; 0: PACE's count bound */
} __attribute__((packed));

#ifndef __cplusplus
_Static_assert(sizeof(struct gs_settle) == GS_SETTLE_SIZE, "settle size");
_Static_assert(sizeof(struct gs_pace_time) == GS_PACE_TIME_SIZE, "pace time size");
_Static_assert(sizeof(struct gs_ping) == GS_PING_SIZE && GS_PONG_SIZE == GS_PING_SIZE, "ping size");
_Static_assert(sizeof(struct gs_policy) == GS_POLICY_SIZE, "policy size");
_Static_assert(sizeof(struct gs_pacing) == GS_PACING_SIZE, "pacing size");
_Static_assert(sizeof(struct gs_ledger) == GS_LEDGER_SIZE, "ledger size");
_Static_assert(sizeof(struct gs_charge) == GS_CHARGE_SIZE, "charge size");
_Static_assert(sizeof(struct gs_charged) == GS_CHARGED_SIZE, "charged size");
_Static_assert(sizeof(struct gs_return) == GS_RETURN_SIZE, "return size");
_Static_assert(sizeof(struct gs_idle) == GS_IDLE_SIZE, "idle size");
_Static_assert(sizeof(struct gs_pace) == GS_PACE_SIZE, "pace size");
_Static_assert(sizeof(struct gs_raise) == GS_RAISE_SIZE, "raise size");
_Static_assert(sizeof(struct gs_header) == GS_HEADER_SIZE, "header size");
_Static_assert(sizeof(struct gs_hello) == GS_HELLO_SIZE, "hello size");
_Static_assert(sizeof(struct gs_welcome) == GS_WELCOME_SIZE, "welcome size");
_Static_assert(sizeof(struct gs_acquire) == GS_ACQUIRE_SIZE, "acquire size");
_Static_assert(sizeof(struct gs_grant) == GS_GRANT_SIZE, "grant size");
_Static_assert(sizeof(struct gs_release) == GS_RELEASE_SIZE, "release size");
_Static_assert(sizeof(struct gs_contended) == GS_CONTENDED_SIZE, "contended size");
_Static_assert(sizeof(struct gs_revoked) == GS_REVOKED_SIZE, "revoked size");
_Static_assert(sizeof(struct gs_memreq) == GS_MEMREQ_SIZE, "memreq size");
_Static_assert(sizeof(struct gs_memreply) == GS_MEMREPLY_SIZE, "memreply size");
_Static_assert(sizeof(struct gs_evict) == GS_EVICT_SIZE, "evict size");
_Static_assert(sizeof(struct gs_usage) == GS_USAGE_SIZE, "usage size");
_Static_assert(sizeof(struct gs_rejoin) == GS_REJOIN_SIZE, "rejoin size");
#endif

#endif
