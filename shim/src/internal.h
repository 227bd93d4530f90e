/*
 * Declarations shared by the shim's translation units. Nothing here is
 * exported: the library is built with -fvisibility=hidden and a version
 * script, and only GS_EXPORT functions (CUDA entry points and dlsym) leave it.
 */
#ifndef GS_INTERNAL_H
#define GS_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "cuda_abi.h"

#define GS_EXPORT __attribute__((visibility("default")))
#define GS_LIKELY(x) __builtin_expect(!!(x), 1)
#define GS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- generated from hooks.def ---- */
enum gs_hook_id {
#define GS_HOOK(cls, name, params, args, extra) GS_ID_##name,
#include "hooks.def"
#undef GS_HOOK
    GS_HOOK_COUNT
};

#define GS_HOOK(cls, name, params, args, extra) typedef CUresult(*gs_fn_##name) params;
#include "hooks.def"
#undef GS_HOOK

/* Prototypes of the entry points, so every definition (generated in hooks.c, hand-written in
 * procaddr.c and mm_*.c) is checked against the driver's signature here (-Wmissing-prototypes). */
#define GS_HOOK(cls, name, params, args, extra) CUresult name params;
#include "hooks.def"
#undef GS_HOOK

/* ---- configuration (config.c): read once, in gs_init ---- */
enum { GS_LOG_ERROR = 0, GS_LOG_WARN = 1, GS_LOG_INFO = 2, GS_LOG_DEBUG = 3 };
#define GS_IDLE_MIN_US 50 /* the shortest idle window (Linux's default timer slack is 50 us) */

struct gs_config {
    uint32_t priority;
    uint32_t quantum_ms; /* 0: take the scheduler's; else min(ours, scheduler's) */
    uint32_t idle_us;          /* GPUSHARE_IDLE_US, else GPUSHARE_IDLE_MS x 1000: release after this long idle */
    uint32_t connect_timeout_ms;
    /* The five settings below marked (policy) are in force as gs_config_env_policy last set them: the
     * environment's value where the scheduler allows it or where it only makes the process stricter,
     * else the default. Written by the background thread, read anywhere: atomic. */
    _Atomic uint32_t wait_timeout_ms; /* (policy) 0: wait for a grant as long as the scheduler lives */
    uint32_t reconnect_max_ms;  /* backoff cap between reconnection attempts after the scheduler went away */
    uint32_t restore_wait_ms;   /* with memory swapped out and no scheduler: wait this long, then restore alone */
    _Atomic uint32_t memreply_timeout_ms; /* (policy) longest wait for a MEMREPLY before the connection is given up */
    int log_level;
    char cuda_library[256];
    uint64_t budget_cap;      /* GPUSHARE_BUDGET_BYTES: at most this much of the scheduler's budget (0: all) */
    uint64_t segment_bytes;   /* GPUSHARE_SEGMENT_MIB: cuMemAlloc above this swaps in segments (0: whole) */
    _Atomic int64_t pace_override;     /* (policy) GPUSHARE_PACE_OVERRIDE: the launch bound in force (0: none); -1: the scheduler's */
    _Atomic int64_t pace_time_override_us; /* (policy) GPUSHARE_PACE_TIME_OVERRIDE_US: the bound in GPU time (0: none); -1: the scheduler's */
    _Atomic uint32_t pace_wait_max_ms; /* (policy) GPUSHARE_PACE_WAIT_MAX_MS: longest wait for the process's own work, then no pacing */
    _Atomic uint32_t pace_full_us;     /* (policy) GPUSHARE_PACE_FULL_US: a launch that runs this long counts as a whole one */
};
extern struct gs_config gs_cfg;
void gs_config_load(void);

/* ---- the shared GPUs (config.c reads them, dev.c picks one per call) ---- */
/* GPUSHARE_GPU_UUID names one GPU (the single form: every call is that GPU's) or several, separated by
 * commas (the list form: GPUSHARE_SOCKET, _OVERSUB and _MEMORY_LIMIT_BYTES then say uuid=value per GPU,
 * and each call works on the GPU of its context). docs/multigpu.md. */
#define GS_MAX_DEVS 16
#define GS_DEV_NONE GS_MAX_DEVS /* a GPU outside the list: not shared, every call passes through */
#define GS_DEV_SLOTS (GS_MAX_DEVS + 1)
struct gs_dev {
    char uuid[64];
    char socket_path[108]; /* sizeof(sun_path) */
    int socket_set;
    int oversub;           /* back device memory with swappable VMM allocations */
    uint64_t memory_limit; /* most device memory the process may allocate on this GPU (0: none) */
};
extern struct gs_dev gs_devs[GS_DEV_SLOTS]; /* [GS_DEV_NONE]: no socket, no limit */
extern int gs_ndevs;                          /* entries in use */
extern int gs_multi;                          /* the list form: each call picks its GPU */
/* The GPU the calling thread works on: set by gs_dev_pick* at a hook's entry, or once by a thread of the
 * shim's that serves one GPU; 0 in the single form. Every per-GPU module reads its state through it. */
extern __thread int gs_dev_cur;
int gs_dev_pick_ctx_slow(CUcontext ctx);
int gs_dev_pick_stream_slow(CUstream s);
int gs_dev_pick_ptr_slow(CUdeviceptr p);
int gs_dev_pick_handle_slow(uint64_t h);
int gs_dev_pick_va_slow(CUdeviceptr p);
int gs_dev_slot_of_ordinal(CUdevice ord);
int gs_dev_slot_of_ctx(CUcontext ctx);
int gs_dev_of_uuid(const char *uuid);
void gs_dev_ctx_seen(CUcontext ctx, CUdevice dev); /* a context made on an ordinal (CTXNEW) */
/* Picks (and makes current for this thread) the GPU of the current context / of a stream's context / of
 * a device pointer; the single form: 0, one load and a branch. */
static inline int gs_dev_pick(void)
{
    if (GS_LIKELY(!gs_multi))
        return 0;
    return gs_dev_cur = gs_dev_pick_ctx_slow(NULL);
}
/* A macro: the stream expression (a launch config's field) is read only in the list form. */
#define gs_dev_pick_stream(s) (GS_LIKELY(!gs_multi) ? 0 : (gs_dev_cur = gs_dev_pick_stream_slow(s)))
static inline int gs_dev_pick_ordinal(CUdevice ord)
{
    if (GS_LIKELY(!gs_multi))
        return 0;
    return gs_dev_cur = gs_dev_slot_of_ordinal(ord);
}
/* A VMM handle: the GPU whose limit counts it, else the current context's. */
static inline int gs_dev_pick_handle(uint64_t h)
{
    if (GS_LIKELY(!gs_multi))
        return 0;
    return gs_dev_cur = gs_dev_pick_handle_slow(h);
}
/* A VMM mapping at p (cuMemUnmap, cuMemSetAccess, cuMemRetainAllocationHandle): the GPU whose limit or
 * memory manager counts the handle mapped there, else the device of the allocation the driver has there,
 * else the current context's. */
static inline int gs_dev_pick_va(CUdeviceptr p)
{
    if (GS_LIKELY(!gs_multi))
        return 0;
    return gs_dev_cur = gs_dev_pick_va_slow(p);
}
/* A cuMemCreate: the device its properties name. */
#define gs_dev_pick_prop(prop)                                                                               \
    (GS_LIKELY(!gs_multi) ? 0                                                                                \
     : (prop) != NULL && (prop)->location.type == CU_MEM_LOCATION_TYPE_DEVICE                                \
         ? (gs_dev_cur = gs_dev_slot_of_ordinal((prop)->location.id))                                        \
         : (gs_dev_cur = gs_dev_pick_ctx_slow(NULL)))
static inline int gs_dev_pick_ptr(CUdeviceptr p)
{
    if (GS_LIKELY(!gs_multi))
        return 0;
    return gs_dev_cur = gs_dev_pick_ptr_slow(p);
}
/* Puts the (policy) settings in force: the environment's values when allowed (no scheduler, one older than
 * protocol 6, or one whose POLICY allows it), else only those that make the process stricter, the others
 * their defaults (said: the scheduler said so; one line then says which were ignored). Then the launch
 * bound is applied again. */
void gs_config_env_policy(int allowed, int said);

/* ---- memory limit (cap.c): GPUSHARE_MEMORY_LIMIT_BYTES; every call below only when it is set ---- */
enum { GS_CAP_PTR = 1, GS_CAP_HANDLE = 2, GS_CAP_MAP = 3, GS_CAP_ARRAY = 4, GS_CAP_EXPORT = 5, GS_CAP_GHOST = 6 };
static inline int gs_cap_on(void)
{
    return gs_devs[gs_dev_cur].memory_limit != 0;
}
/* Some shared GPU has a limit (a free looks its pointer up in every GPU's table). */
extern int gs_cap_any;
/* Takes n bytes of the limit (CUDA_SUCCESS) or refuses them (CUDA_ERROR_OUT_OF_MEMORY); no lock. */
CUresult gs_cap_charge(uint64_t n);
void gs_cap_uncharge(uint64_t n);
/* After a successful allocation charged with bytes: remembers it for its free. */
void gs_cap_track(uint32_t kind, uint64_t key, uint64_t bytes);
/* cuMemRetainAllocationHandle on a handle we count: one more cuMemRelease before its bytes return. */
int gs_cap_retain(uint32_t kind, uint64_t key);
/* Whether the table counts key. */
int gs_cap_known(uint32_t kind, uint64_t key);
/* After a successful cuMemMap: the mapping holds the handle's charge until unmapped; own: the bytes the
 * caller charged for a handle the table did not know (returns those it could not keep: give them back). */
uint64_t gs_cap_map(CUdeviceptr va, uint64_t handle, uint64_t own);
/* After a successful cuMemExportToShareableHandle / cuMemImportFromShareableHandle (an import of the
 * process's own export shares the original handle's charge). */
void gs_cap_exported(int type, const void *shareable, uint64_t handle);
void gs_cap_imported(int type, const void *os_handle, uint64_t handle);
/* After cuMemRetainAllocationHandle gave a handle value the table does not count for the mapping at va. */
void gs_cap_retained_at(CUdeviceptr va, uint64_t handle);
/* What an allocation of n bytes takes: n rounded up to the driver's granularity from one granule up. */
uint64_t gs_cap_size(uint64_t n);
/* cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, value) under the limit; set calls the driver. */
CUresult gs_cap_heap(uint64_t value, CUresult (*set)(uint64_t value));
/* After a successful cuMemUnmap: the mappings that started in the range let go of their handles. */
void gs_cap_unmap(CUdeviceptr va, size_t size);
struct gs_cap_free {
    uint64_t key, bytes, parent;
    uint32_t kind, refs; /* refs 0: not counted */
    int dev;             /* the GPU whose limit counted it */
};
/* The GPU whose limit counts key (GS_DEV_NONE: none). */
int gs_cap_owner(uint32_t kind, uint64_t key);
/* Around a free: begin before the driver's call (forgets the allocation), end with its result
 * (gives the bytes back, or remembers the allocation again when the driver refused). */
int gs_cap_free_begin(uint32_t kind, uint64_t key, struct gs_cap_free *f);
void gs_cap_free_end(const struct gs_cap_free *f, CUresult r);
uint64_t gs_cap_used(void);
/* After an allocation charged with bytes: tracked when it succeeded, the bytes back when it failed. */
static inline void gs_cap_done(CUresult r, uint32_t kind, uint64_t key, uint64_t bytes)
{
    if (r == CUDA_SUCCESS)
        gs_cap_track(kind, key, bytes);
    else
        gs_cap_uncharge(bytes);
}
/* What cuMemGetInfo and NVML report under the limit, from what the driver said. */
void gs_cap_report(uint64_t drv_total, uint64_t drv_free, uint64_t *total, uint64_t *free_);
void gs_cap_atfork_child(void);
/* The claim's ledger (protocol 6): the LEDGER read with a connection's WELCOME (conn.c); once the
 * connection is up (after REJOIN on a reconnection), start puts the process in it and announces what it
 * holds; away when the connection ends (its grant bounds it until the next), stop when the process
 * runs without a scheduler for good or the next connection keeps no ledger for it (the limit alone).
 * Messages: size for the reader, 0 for a type that is not the ledger's; on_message under the gate's
 * mutex. policy_changed: the connection's POLICY was read (a waiting CHARGE's timeout follows it). */
struct gs_ledger;
void gs_cap_ledger_offer(const struct gs_ledger *l);
void gs_cap_ledger_start(int fd);
void gs_cap_ledger_stop(void);
void gs_cap_ledger_away(void);
void gs_cap_policy_changed(void);
uint32_t gs_cap_msg_size(uint16_t type, uint16_t version);
void gs_cap_on_message(int fd, const unsigned char *msg, uint16_t type);
/* A context creation asks first (CUDA_ERROR_OUT_OF_MEMORY: the claim's ledger refused this process; it
 * connects if it never did), and says when one was made (a context exists: a later connection announces
 * it). */
CUresult gs_cap_ctx_admit(void);
void gs_cap_ctx_made(void);
/* nvml.c: NVML's memory queries under the limit; dlsym's answer for name (NULL: none). */
void *gs_nvml_dlsym(const char *name, void *found);

/* ---- logging (log.c): never on the hot path ---- */
void gs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The single fail-open warning: the first caller prints, later ones log at debug. */
void gs_warn_failopen(const char *reason);
/* Says once, at info level, that the process runs without the lock by configuration (no warning after it). */
void gs_note_no_lock(const char *reason);

/* ---- resolution (resolve.c) ---- */
void gs_init(void);
void gs_bind_cuda(void);
void *gs_bind_slow(int id);
int gs_id_for_name(const char *name);
void *gs_substitute(const char *symbol, void *fn);
void *gs_real_dlsym(void *handle, const char *name); /* the C library's dlsym (NULL before gs_init) */
extern _Atomic(void *) gs_real_fn[GS_HOOK_COUNT];
extern const char *const gs_hook_names[GS_HOOK_COUNT];

static inline void *gs_real(int id)
{
    void *p = atomic_load_explicit(&gs_real_fn[id], memory_order_acquire);
    if (GS_UNLIKELY(p == NULL))
        p = gs_bind_slow(id);
    return p;
}

/* ---- the gate (gate.c): is this process allowed to touch the GPU now ---- */
/*
 * gs_gate_word: low 32 bits count calls inside the driver, high 32 bits count
 * every entry (activity, for idle detection). One atomic add covers both.
 * gs_gate_open: 1 while we hold the lock or run in pass-through.
 * Entering increments the word and then reads the gate; a releaser closes the
 * gate and then waits for the in-flight count to reach zero. Both sides are
 * seq_cst, so either the caller sees the gate closed or the releaser sees the
 * caller in flight (Dekker).
 */
#define GS_INFLIGHT_ONE 1ull
#define GS_ACTIVITY_ONE (1ull << 32)
struct gs_gate_hot {
    _Atomic uint64_t word;
    atomic_int open;
} __attribute__((aligned(64))); /* one cache line per GPU */
extern struct gs_gate_hot gs_hot[GS_DEV_SLOTS];
extern atomic_int gs_count_calls;
extern _Atomic uint64_t gs_calls[GS_HOOK_COUNT];
void gs_gate_wait(void);

/* Passes the gate of GPU d, which is gs_dev_cur (a wait serves the calling thread's GPU): returns the
 * GPU to hand to gs_gate_leave, -1 for a GPU that is not shared (nothing to pass). */
static inline int gs_gate_pass(int d)
{
    if (GS_UNLIKELY(d == GS_DEV_NONE))
        return -1;
    struct gs_gate_hot *h = &gs_hot[d];
    atomic_fetch_add_explicit(&h->word, GS_INFLIGHT_ONE | GS_ACTIVITY_ONE, memory_order_seq_cst);
    if (GS_LIKELY(atomic_load_explicit(&h->open, memory_order_seq_cst)))
        return d;
    atomic_fetch_sub_explicit(&h->word, GS_INFLIGHT_ONE, memory_order_seq_cst);
    gs_gate_wait(); /* returns in flight, with the gate open */
    return d;
}

/* Passes the gate of the calling thread's GPU (gs_dev_cur, picked by the caller), counting call id. */
static inline int gs_gate_enter(int id)
{
    if (GS_UNLIKELY(atomic_load_explicit(&gs_count_calls, memory_order_relaxed)))
        atomic_fetch_add_explicit(&gs_calls[id], 1, memory_order_relaxed);
    return gs_gate_pass(gs_dev_cur);
}

static inline void gs_gate_leave(int d)
{
    if (GS_LIKELY(d >= 0))
        atomic_fetch_sub_explicit(&gs_hot[d].word, GS_INFLIGHT_ONE, memory_order_release);
}

/*
 * A copy or memset in the list form of several GPUs (hooks.def classes COPY and SCOPY) passes the gate
 * of every GPU whose memory it touches: the GPU of each device pointer's swappable allocation (the memory
 * manager's table); for other device memory, the GPU the driver names (a synchronous call) or the
 * stream's (a stream's); host memory counts as the current context's GPU (a synchronous call) or the
 * stream's; a stream's work always passes its stream's GPU too.
 * The gates are passed in slot order, each waited for as a single gate is (GPUSHARE_WAIT_TIMEOUT_MS),
 * so two threads copying in opposite directions wait in the same order. docs/multigpu.md.
 */
#define GS_DEV_CUR (-2)   /* a pointer the memory manager does not know: the call's default GPU */
#define GS_DEV_NOMEM (-1) /* no device memory on that side (host memory, an array) */
#define GS_GATES_MAX 3
struct gs_gates {
    int n;
    int d[GS_GATES_MAX];
};
/* The GPU of the swappable allocation at p; else, with ask, of the device memory the driver says p is
 * (a listed GPU's, not managed); else GS_DEV_CUR. With a context (a peer copy), that context's GPU
 * instead of asking. */
int gs_dev_of_mem(CUdeviceptr p, int ask);
int gs_dev_of_peer(CUdeviceptr p, CUcontext ctx);
/* The GPUs of a 2D/3D copy's destination (dst 1) or source side (ask: as gs_dev_of_mem). */
int gs_dev_of_m2d(const CUDA_MEMCPY2D *m, int dst, int ask);
int gs_dev_of_m3d(const CUDA_MEMCPY3D *m, int dst, int ask);
int gs_dev_of_m3dpeer(const CUDA_MEMCPY3D_PEER *m, int dst, int ask);
/* Passes the gates of a synchronous call's GPUs a and b (GS_DEV_CUR: the current context's); 0 (the
 * work is done when the call returns). */
int gs_gates_enter(struct gs_gates *g, int id, int a, int b);
/* A stream's: its GPU's gate and those of a and b (GS_DEV_CUR: the stream's GPU). 1 when a or b is
 * another GPU than the stream's: the work must be complete before those gates are left (gs_gates_settle). */
int gs_gates_enter_stream(struct gs_gates *g, int id, CUstream s, int a, int b);
/* Waits for the stream's work (its GPU may run it after another GPU's gate is left, when that GPU's
 * memory may be swapped out); never while a stream captures (the work is then recorded, not run). */
void gs_gates_settle(CUstream s);
void gs_gates_leave(const struct gs_gates *g);

/* ---- GPU quiescing (gpu.c) ---- */
void gs_ctx_add(CUcontext ctx);
void gs_ctx_remove(CUcontext ctx);
void gs_ctx_record_current(void);
/* The process's one context, or NULL when it has none or several. */
CUcontext gs_ctx_only(void);
/*
 * Stream capture. While any stream of the process captures, in any mode and on any thread, the
 * shim makes no call the driver refuses during capture (page-locking, synchronizing, copies
 * outside the captured stream): a refused call returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidates the capture, and in global mode (PyTorch's default) even the shim's own threads
 * are bound by another thread's capture. gs_captures counts the captures begun and not ended
 * (one load on the paths that check it); a begin counts itself first and then waits until no
 * shim thread is inside such a call (gs_unsafe_begin, Dekker-style like the gate), so a capture
 * never starts under one.
 */
extern atomic_int gs_captures;
static inline int gs_capturing(void)
{
    return atomic_load_explicit(&gs_captures, memory_order_seq_cst) > 0;
}
/* Before a capture begins: counts it and waits for the shim's refused calls in flight. */
void gs_capture_begin(void);
/* After the driver's answer: remembers the stream, or uncounts a begin that failed. */
void gs_capture_begun(CUstream s, CUresult r);
void gs_capture_remove(CUstream s);
int gs_capture_active(void);
/* A shim thread about to make a call a capture forbids: 1 when allowed (end with gs_unsafe_end),
 * 0 while a stream captures (nothing to end). */
int gs_unsafe_begin(void);
void gs_unsafe_end(void);
/* Puts the calling shim thread in relaxed capture mode, so another thread's global-mode capture
 * never binds the few queries it makes (stream capture status, events of its own streams). */
void gs_thread_relax_capture(void);
/* Waits for all GPU work of every known context; -1 (nothing synchronized) while a stream captures. */
int gs_gpu_drain(void);
void gs_gpu_atfork_child(void);

/* ---- launch pacing (pace.c): a bound on the launches a process keeps outstanding ---- */
/* The bound in force per shared GPU (0: none): that GPU's scheduler's (PACE) or GPUSHARE_PACE_OVERRIDE's.
 * The launch hooks load their GPU's, relaxed, before each launch; everything else runs only when it is
 * not 0. */
extern _Atomic uint32_t gs_pace_max[GS_DEV_SLOTS];
/* Threads inside a paced launch before its gate entry (weighing it, or waiting for earlier work): the
 * process is busy in a GPU call, never idle, however long such a thread goes without running (a starved
 * CPU, a slow driver query); gate.c releases the lock for idleness only while this is 0. */
extern atomic_int gs_pace_busy;
struct gs_pace_ticket {
    int ring, slot; /* slot -1: nothing to record after the launch */
    uint32_t gen;
};
/* What a launch's GPU time is estimated by: the kernel and its grid, or the graph (never 0). */
static inline uint64_t gs_launch_key(const void *what, uint64_t grid)
{
    return ((uint64_t)(uintptr_t)what * 0x9E3779B97F4A7C15ull ^ grid * 0xC2B2AE3D27D4EB4Full) | 1;
}
void gs_pace_init(void); /* after the configuration is read */
/* The calling thread's GPU's scheduler's bound (PACE), or 0 when its connection ends (from_scheduler 0:
 * said nowhere). */
void gs_pace_set(uint32_t max_queued, int from_scheduler);
/* The calling thread's GPU's scheduler's bound in GPU time (PACE_TIME, us; 0: the count bound), or 0 when
 * its connection ends. */
void gs_pace_set_time(uint32_t queue_us, int from_scheduler);
/* Before a launch on stream s (key: gs_launch_key), not in flight: waits while the queue of the stream's
 * context is at its GPU's bound; 1 when the launch counts (then gs_pace_after follows it, in flight, with
 * the launch's stream and result). */
int gs_pace_before(struct gs_pace_ticket *t, uint64_t key, CUstream s);
void gs_pace_after(const struct gs_pace_ticket *t, CUstream s, CUresult launched);
void gs_pace_forget_ctx(CUcontext ctx); /* before cuCtxDestroy: its events are destroyed, never used again */
void gs_pace_forget_dev(CUdevice dev);  /* before a primary context's release or reset, the same */
void gs_pace_log_stats(void);
void gs_pace_atfork_child(void);
void gs_pace_reapply(void); /* after GPUSHARE_PACE_OVERRIDE's value in force changed */
/* The calling thread's GPU's bound in force and where it comes from (GS_PACING_*), for its scheduler
 * (PACING, protocol 6). */
void gs_pace_state(uint32_t *max_queued, uint32_t *state);

/* ---- release on completion (settle.c, SETTLE, protocol 7) ---- */
/* Per shared GPU: the scheduler asked for a release on completion, so launches note their streams. */
extern _Atomic int gs_settle_on[GS_DEV_SLOTS];
void gs_settle_note(CUstream s); /* after a launch on s that succeeded, in flight */
/* The background thread of the calling thread's GPU: records one event on each stream launched on since
 * the last release (0), or -1 when it cannot tell (then the idle window decides). */
int gs_settle_record(void);
int gs_settle_done(void);  /* 1 once every event recorded has completed */
void gs_settle_reset(void); /* at a release: nothing launched since */
void gs_settle_forget_ctx(CUcontext ctx); /* before ctx goes (NULL: a primary context, any) */
void gs_settle_atfork_child(void);

/* ---- scheduler connection (conn.c) ---- */
/* The oldest protocol version the shim speaks: a scheduler that refuses GS_PROTO_VERSION is greeted one
 * version lower at a time, down to this one (gs_conn_open). */
#define GS_SHIM_MIN_VERSION 3u
struct gs_welcome;
int gs_conn_open(struct gs_welcome *w);
uint16_t gs_conn_version(void); /* the version of the current (last opened) connection */
int gs_conn_send(int fd, uint16_t type, uint32_t epoch, uint64_t bytes);
int gs_conn_send_raw(int fd, void *msg, uint16_t type, uint32_t size);
uint64_t gs_now_ns(void);

/* ---- the gate, for the memory manager (gate.c) ---- */
/* Sends a message built by the caller (header filled in here); -1 when not connected. */
int gs_gate_send(void *msg, uint16_t type, uint32_t size);
/* Reads and applies the scheduler's messages for up to ms, on the background thread (a swap-in
 * waiting for RAISE); 0 while the grant being filled in stands, -1 once it ended. mm_mu not held. */
int gs_gate_pump(int ms);
/* Gives the GPU back so that a larger need can be granted (MEMREPLY BUSY); the caller is not in flight. */
void gs_gate_yield(void);
/* Connects now if this process never tried (no lock asked for): the memory limit learns its claim's
 * ledger before the process creates a context, allocates or queries its memory. */
void gs_gate_connect(void);
/* 1 while connected to a scheduler (not pass-through). */
int gs_gate_connected(void);
/* Gives up the connection (the scheduler stopped answering): reconnects and re-announces, as after EOF. */
void gs_gate_drop(const char *reason);
/* Starts a detached thread of the shim's, with every signal blocked in it; pthread_create's result. */
int gs_thread_start(void *(*fn)(void *), void *arg);
/* Fork handlers and the exit report, registered once by gs_init. */
void gs_gate_atfork_prepare(void);
void gs_gate_atfork_parent(void);
void gs_gate_atfork_child(void);
void gs_print_call_counts(void);

/* ---- memory manager (mm.c): swappable device memory for oversubscription, per shared GPU: every call
 * below works on the calling thread's GPU's account (gs_dev_cur) ---- */
enum { GS_MM_OK = 0, GS_MM_NOT_OURS = -1, GS_MM_YIELD = -2 };
/* Per shared GPU: swappable allocations are made there (oversubscription active on it). */
extern atomic_int gs_mm_on[GS_DEV_SLOTS];
/* Oversubscription is active on the calling thread's GPU. */
static inline int gs_mm_here(void)
{
    return atomic_load_explicit(&gs_mm_on[gs_dev_cur], memory_order_relaxed);
}
void gs_mm_configure(uint64_t budget, uint32_t mode);
uint64_t gs_mm_need(void);     /* bytes to ask for in ACQUIRE: working set plus a pending growth */
uint64_t gs_mm_resident(void); /* physically mapped bytes */
void gs_mm_log_stats(void);    /* the memory manager's counters, at exit */
uint64_t gs_mm_swapped(void);
void gs_mm_on_reply(int raise, uint64_t reserved, uint32_t status); /* GRANT / MEMREPLY, under the gate's mutex */
void gs_mm_on_raise(uint64_t reserved);                              /* RAISE, under the gate's mutex */
int gs_mm_swap_in_all(int ignore_budget);                             /* 0: everything resident */
void gs_mm_evict(uint64_t target);                                    /* swap out until resident <= target */
void gs_mm_send_usage(uint32_t reason);
/* On a new connection: the memory state to re-announce (REJOIN); the raise count starts again at 0 and the
 * reservation is what is resident. Atomics only: called under the gate's mutex. */
void gs_mm_rejoin(uint64_t *need, uint64_t *resident, uint64_t *swapped);
/* Allocation entry points (the caller is in flight through the gate). */
CUresult gs_mm_alloc(CUdeviceptr *dptr, size_t n, int split, int *yield); /* split: may be segmented */
int gs_mm_free(CUdeviceptr d, CUresult *r);
void gs_mm_atfork_child(void);
/* A swappable allocation as the application sees it (the range it asked for). */
struct gs_mm_info {
    CUdeviceptr base;
    size_t size;
    CUcontext ctx;
    CUdevice dev;
    uint64_t id;
    int resident;
    int slot; /* the shared GPU whose account counts it */
};
int gs_mm_lookup(CUdeviceptr p, struct gs_mm_info *out);
int gs_mm_budget(uint64_t *total, uint64_t *used);
/* 1 if p lies where the application mapped one of its (swappable) cuMemCreate handles. */
int gs_mm_vmm_mapped(CUdeviceptr p);
/* The GPU of a swappable handle, or of the one mapped at p (GS_DEV_NONE: not the memory manager's). */
int gs_mm_handle_slot(uint64_t h);
int gs_mm_va_slot(CUdeviceptr p);

#endif
