/*
 * A stand-in libcuda.so.1 for CPU-only tests. It exports every entry point
 * in hooks.def plus what the shim and test clients call, and models the one
 * property the lock is about: GPU work is asynchronous. Each work call queues
 * an item that a worker thread "executes" by busy-waiting, writing
 *     Q <pid> <monotonic ns> <entry point>   (every work call, when it is made)
 *     B <pid> <monotonic ns> <entry point>
 *     E <pid> <monotonic ns>
 * to the file named by GPUSHARE_STUB_TRACE (O_APPEND, one write per line), so
 * a test can check that work of two processes never overlapped.
 * cuCtxSynchronize waits until the queue is empty, like the real one.
 * Stream capture follows the real driver's rules (stub_capture.c): a call it
 * refuses during capture fails, invalidates the capture and writes an "X"
 * line to the trace.
 *
 *   GPUSHARE_STUB_TRACE      trace file (no trace when unset)
 *   GPUSHARE_STUB_LAUNCH_US  busy time per launch-like call (default 1000)
 *   GPUSHARE_STUB_COPY_US    busy time per copy/memset/alloc call (default 0: not traced)
 *   GPUSHARE_STUB_WORKER_DELAY_US  the worker waits this long before it starts each item (default 0):
 *                            a GPU that runs queued work late, as the stub's worker does when the
 *                            machine's CPUs are starved; makes "work still queued" races happen every time
 *   GPUSHARE_STUB_RUN_FILE   the worker runs launches (cuLaunch*, cuGraphLaunch*) only as far as the
 *                            number written in this file allows, in all (missing or empty: none); a
 *                            test holds the "GPU" and lets queued work complete one step at a time
 *   GPUSHARE_STUB_EVENT_FAIL create, record, query or elapsed: that event call fails (a driver error)
 *   GPUSHARE_STUB_QUERY_US   each cuEventQuery takes this long (default 0): a thread that polls an event
 *                            and does not come back for a while, as on a starved CPU; each such query
 *                            writes "P <pid> <ns>" to the trace when it returns
 *
 * Events are a position in the one queue: complete once the worker passed it, at a time that counts
 * GPUSHARE_STUB_LAUNCH_US (or _COPY_US) for each item queued before it (cuEventElapsedTime: the
 * difference, exact whatever the machine's load; refused like the real driver's for an event made with
 * CU_EVENT_DISABLE_TIMING or not complete). Each record writes
 *     R <pid> <ns> stream=<the stream handle, 0x2 for the per-thread stream>
 * and the first cuEventQuery of a record that finds it not complete writes
 *     W <pid> <ns>
 * (the caller waits for queued work). A record on a capturing stream belongs to the capture: querying
 * it is refused like the real driver's (an "X" line). Destroying a context or releasing or resetting a
 * primary context destroys every event: using one afterwards fails and writes an "X" line.
 *
 * Memory (stub_vmm.c) is host memory, so device pointers are real addresses
 * and copies move real bytes: copies, memsets and the test "kernel" run on
 * the same worker, in order, like one stream; the synchronous ones wait.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define STUB_EXPORT __attribute__((visibility("default")))
#define HIDDEN_STUB __attribute__((visibility("hidden")))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init(void);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int trace_fd = -1;
static long launch_us = 1000, copy_us, worker_delay_us;
static const char *run_file;
static long launches_run; /* by the worker, with GPUSHARE_STUB_RUN_FILE */

#define QCAP 4096
static struct item {
    const char *name;
    long us;
    void (*fn)(uint64_t *a); /* the work itself, or NULL */
    uint64_t a[4];
} queue[QCAP];
static unsigned qhead, qtail; /* pending = qtail - qhead; the worker bumps qhead when an item finished */
static uint64_t queued_us;    /* the busy time of every item queued so far: an event's time stamp */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((visibility("hidden"))) void stub_trace(char kind, const char *name);
static void trace(char kind, const char *name)
{
    if (trace_fd < 0)
        return;
    char line[160];
    int n = snprintf(line, sizeof(line), "%c %d %llu %s\n", kind, (int)getpid(), (unsigned long long)now_ns(),
                     name ? name : "");
    ssize_t w = write(trace_fd, line, (size_t)n);
    (void)w;
}

__attribute__((visibility("hidden"))) void stub_trace(char kind, const char *name)
{
    pthread_once(&once, init);
    trace(kind, name);
}

static int is_launch(const char *name)
{
    return strncmp(name, "cuLaunch", 8) == 0 || strncmp(name, "cuGraphLaunch", 13) == 0;
}

/* How many launches GPUSHARE_STUB_RUN_FILE lets the worker run in all. */
static long run_allowed(void)
{
    char b[32] = {0};
    int fd = open(run_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, b, sizeof(b) - 1);
    close(fd);
    return n > 0 ? atol(b) : 0;
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (qhead == qtail)
            pthread_cond_wait(&cv, &mu);
        struct item it = queue[qhead % QCAP];
        pthread_mutex_unlock(&mu);
        if (run_file != NULL && is_launch(it.name)) {
            while (launches_run >= run_allowed())
                usleep(1000);
            launches_run++;
        }
        if (worker_delay_us > 0)
            usleep((useconds_t)worker_delay_us);
        if (it.us > 0)
            trace('B', it.name);
        if (it.fn)
            it.fn(it.a);
        uint64_t end = now_ns() + (uint64_t)it.us * 1000ull;
        while (now_ns() < end)
            ; /* the "GPU" is busy */
        if (it.us > 0)
            trace('E', NULL);
        pthread_mutex_lock(&mu);
        qhead++;
        pthread_cond_broadcast(&cv);
    }
    return NULL;
}

/* The child of fork() gets a queue of its own and a worker to run it (the parent's worker is not
 * in the child; its queue and lock are the parent's state at the fork). */
static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv, NULL);
    qhead = qtail = 0;
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    pthread_detach(th);
}

static void init(void)
{
    const char *t = getenv("GPUSHARE_STUB_TRACE");
    if (t && *t)
        trace_fd = open(t, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const char *l = getenv("GPUSHARE_STUB_LAUNCH_US");
    if (l && *l)
        launch_us = atol(l);
    const char *c = getenv("GPUSHARE_STUB_COPY_US");
    if (c && *c)
        copy_us = atol(c);
    const char *d = getenv("GPUSHARE_STUB_WORKER_DELAY_US");
    if (d && *d)
        worker_delay_us = atol(d);
    const char *rf = getenv("GPUSHARE_STUB_RUN_FILE");
    if (rf && *rf)
        run_file = rf;
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    pthread_detach(th);
    pthread_atfork(NULL, NULL, atfork_child);
}

/* Queues work (fn may be NULL: just busy time); with wait, returns when it ran. */
__attribute__((visibility("hidden"))) CUresult stub_enqueue(const char *name, void (*fn)(uint64_t *), uint64_t a0,
                                                            uint64_t a1, uint64_t a2, uint64_t a3, int wait)
{
    pthread_once(&once, init);
    trace('Q', name); /* the call itself, when the application made it */
    long us = is_launch(name) ? launch_us : copy_us;
    if (us <= 0 && fn == NULL)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    while (qtail - qhead >= QCAP) /* a full queue blocks the launch, as on a real GPU */
        pthread_cond_wait(&cv, &mu);
    queue[qtail % QCAP] = (struct item){name, us, fn, {a0, a1, a2, a3}};
    unsigned mine = ++qtail;
    queued_us += (uint64_t)(us > 0 ? us : 0);
    pthread_cond_broadcast(&cv);
    while (wait && (int)(qhead - mine) < 0)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

__attribute__((visibility("hidden"))) void stub_drain(void)
{
    pthread_once(&once, init);
    pthread_mutex_lock(&mu);
    while (qhead != qtail)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* Whether an item reads or writes any byte of [lo, hi). */
static int item_touches(const struct item *it, uint64_t lo, uint64_t hi)
{
    const uint64_t *a = it->a;
    if (it->fn == NULL)
        return 0;
    if (strncmp(it->name, "cuMemcpy", 8) == 0) /* a0 dst, a1 src, a2 bytes: either end */
        return (a[0] < hi && a[0] + a[2] > lo) || (a[1] < hi && a[1] + a[2] > lo);
    uint64_t n = a[2]; /* memsets: a0 at, a2 count */
    if (strcmp(it->name, "cuMemsetD32_v2") == 0)
        n = a[2] * 4;
    else if (strcmp(it->name, "cuLaunchKernel") == 0)
        n = a[1]; /* the XOR kernel: a0 at, a1 bytes */
    return a[0] < hi && a[0] + n > lo;
}

/* The name of queued or running work (the worker leaves an item queued until it finished) that
 * touches [lo, hi), or NULL. */
__attribute__((visibility("hidden"))) const char *stub_inflight_at(uint64_t lo, uint64_t hi)
{
    pthread_once(&once, init);
    const char *hit = NULL;
    pthread_mutex_lock(&mu);
    for (unsigned i = qhead; hit == NULL && i != qtail; i++)
        if (item_touches(&queue[i % QCAP], lo, hi))
            hit = queue[i % QCAP].name;
    pthread_mutex_unlock(&mu);
    return hit;
}

static CUresult submit(const char *name)
{
    return stub_enqueue(name, NULL, 0, 0, 0, 0, 0);
}

/* ---- events: a position in the one queue, complete once the worker passed it ---- */
struct stub_event {
    unsigned ticket;
    uint64_t at_us;  /* when it completes, in the queue's busy time */
    int timing;      /* not made with CU_EVENT_DISABLE_TIMING */
    unsigned epoch; /* ctx_epoch when made: the context's events die with it */
    int captured;   /* recorded on a capturing stream: part of the graph */
    int waited;     /* the current record was found not complete once */
};
static unsigned ctx_epoch; /* under mu: bumped when a context (and its events) is destroyed */

HIDDEN_STUB int stub_capture_record(CUstream s, const char *name, void (*fn)(uint64_t *), uint64_t a0, uint64_t a1,
                                    uint64_t a2, uint64_t a3);
HIDDEN_STUB CUresult stub_capture_conflict(const char *name, CUstream s, int any);

static int event_fails(const char *call)
{
    const char *f = getenv("GPUSHARE_STUB_EVENT_FAIL");
    return f != NULL && strcmp(f, call) == 0;
}

/* An event of a destroyed context: the real driver's behaviour is undefined; here it fails loudly. mu held. */
static int dead_locked(struct stub_event *e, const char *call)
{
    if (e->epoch == ctx_epoch)
        return 0;
    trace('X', call);
    return 1;
}

static void contexts_gone(void)
{
    pthread_once(&once, init);
    pthread_mutex_lock(&mu);
    ctx_epoch++;
    pthread_mutex_unlock(&mu);
}

STUB_EXPORT CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
    pthread_once(&once, init);
    if (event_fails("create"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct stub_event *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
    pthread_mutex_lock(&mu);
    e->epoch = ctx_epoch;
    pthread_mutex_unlock(&mu);
    *ev = (CUevent)e;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuEventRecord(CUevent ev, CUstream s)
{
    pthread_once(&once, init);
    if (event_fails("record"))
        return CUDA_ERROR_INVALID_VALUE;
    struct stub_event *e = (struct stub_event *)ev;
    int captured = stub_capture_record(s, "cuEventRecord", NULL, 0, 0, 0, 0) && s != NULL;
    pthread_mutex_lock(&mu);
    if (dead_locked(e, "cuEventRecord-of-a-destroyed-context")) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    e->ticket = qtail;
    e->at_us = queued_us;
    e->captured = captured;
    e->waited = 0;
    pthread_mutex_unlock(&mu);
    char what[40];
    snprintf(what, sizeof(what), "stream=%#lx", (unsigned long)(uintptr_t)s);
    trace('R', what);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuEventQuery(CUevent ev)
{
    pthread_once(&once, init);
    if (event_fails("query"))
        return CUDA_ERROR_INVALID_VALUE;
    const char *slow = getenv("GPUSHARE_STUB_QUERY_US");
    if (slow != NULL && atol(slow) > 0) {
        usleep((useconds_t)atol(slow));
        trace('P', NULL);
    }
    struct stub_event *e = (struct stub_event *)ev;
    pthread_mutex_lock(&mu);
    if (dead_locked(e, "cuEventQuery-of-a-destroyed-context")) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    int captured = e->captured;
    int done = (int)(qhead - e->ticket) >= 0;
    int first_wait = !done && !e->waited;
    if (!done)
        e->waited = 1;
    pthread_mutex_unlock(&mu);
    if (captured) /* the real driver refuses to query an event recorded in a capture */
        return stub_capture_conflict("cuEventQuery-of-a-captured-event", NULL, 1) != CUDA_SUCCESS
                   ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
                   : CUDA_ERROR_INVALID_VALUE;
    if (first_wait)
        trace('W', NULL);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

STUB_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    pthread_once(&once, init);
    if (event_fails("elapsed"))
        return CUDA_ERROR_INVALID_VALUE;
    struct stub_event *a = (struct stub_event *)start, *b = (struct stub_event *)end;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    if (dead_locked(a, "cuEventElapsedTime-of-a-destroyed-context") ||
        dead_locked(b, "cuEventElapsedTime-of-a-destroyed-context") || !a->timing || !b->timing)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if ((int)(qhead - a->ticket) < 0 || (int)(qhead - b->ticket) < 0)
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)b->at_us - (int64_t)a->at_us) / 1000.0);
    pthread_mutex_unlock(&mu);
    return r;
}

STUB_EXPORT CUresult cuEventSynchronize(CUevent ev)
{
    pthread_once(&once, init);
    struct stub_event *e = (struct stub_event *)ev;
    pthread_mutex_lock(&mu);
    if (dead_locked(e, "cuEventSynchronize-of-a-destroyed-context")) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    while ((int)(qhead - e->ticket) < 0)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuEventDestroy_v2(CUevent ev)
{
    pthread_once(&once, init);
    struct stub_event *e = (struct stub_event *)ev;
    pthread_mutex_lock(&mu);
    int dead = dead_locked(e, "cuEventDestroy-of-a-destroyed-context");
    pthread_mutex_unlock(&mu);
    if (dead)
        return CUDA_ERROR_INVALID_HANDLE; /* kept: a use after this must still be caught */
    free(ev);
    return CUDA_SUCCESS;
}

/* ---- context bookkeeping ---- */

/* GPUSHARE_STUB_DEVICES=n (default 1): n devices, device d's context 0x1000 + 0x100 d and UUID
 * GPU-00000000-0000-0000-0000-0000000000dd; each thread's current device is 0 until it sets another. */
static __thread int cur_dev;
static __thread int push_stack[8];

static int ndevices(void)
{
    const char *v = getenv("GPUSHARE_STUB_DEVICES");
    int n = v != NULL ? atoi(v) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : n;
}

static CUcontext ctx_of(int d)
{
    return (CUcontext)(uintptr_t)(0x1000 + 0x100 * d);
}

static int dev_of_ctx(CUcontext c)
{
    uintptr_t v = (uintptr_t)c;
    if (v < 0x1000 || (v - 0x1000) % 0x100 != 0 || (int)((v - 0x1000) / 0x100) >= ndevices())
        return -1;
    return (int)((v - 0x1000) / 0x100);
}

static CUcontext fake_ctx(void)
{
    return ctx_of(cur_dev);
}

__attribute__((visibility("hidden"))) int stub_cur_dev(void);
__attribute__((visibility("hidden"))) int stub_cur_dev(void)
{
    return cur_dev;
}

/* stub_vmm.c: a context on dev counts GPUSHARE_STUB_CTX_BYTES in the holdings file */
__attribute__((visibility("hidden"))) void stub_hold_context(int dev);

/* ---- every hooks.def entry point ---- */
/* Weak: stub_vmm.c defines the ones that move bytes. */
#define STUB_WORK(name, params, args, extra)                                                       \
    STUB_EXPORT CUresult name params;                                                              \
    __attribute__((weak)) STUB_EXPORT CUresult name params { return submit(#name); }
#define STUB_MM(name, params, args, extra) STUB_EXPORT CUresult name params;
/* stub_capture.c defines them */
#define STUB_CAPBEGIN(name, params, args, s) STUB_EXPORT CUresult name params;
#define STUB_CAPEND(name, params, args, s) STUB_EXPORT CUresult name params;
#define STUB_CTXNEW(name, params, args, pctx)                                                      \
    STUB_EXPORT CUresult name params;                                                              \
    STUB_EXPORT CUresult name params { if (dev < 0 || dev >= ndevices()) return CUDA_ERROR_INVALID_VALUE; *(pctx) = ctx_of(dev); stub_hold_context(dev); return CUDA_SUCCESS; }
#define STUB_CTXGONE(name, params, args, ctx)                                                      \
    STUB_EXPORT CUresult name params;                                                              \
    STUB_EXPORT CUresult name params { (void)(ctx); contexts_gone(); return CUDA_SUCCESS; }
/* as if this released the last reference: the primary context, and its events, are gone */
#define STUB_DEVGONE(name, params, args, dev)                                                      \
    STUB_EXPORT CUresult name params;                                                              \
    STUB_EXPORT CUresult name params { (void)(dev); contexts_gone(); return CUDA_SUCCESS; }
#define STUB_LAUNCH STUB_WORK
#define STUB_SWORK STUB_WORK
#define STUB_COPY STUB_WORK
#define STUB_SCOPY STUB_WORK
#define STUB_PROC(name, params, args, extra)
#define STUB_USE(name, params, args, extra) STUB_EXPORT CUresult name params;
#define GS_HOOK(cls, name, params, args, extra) STUB_##cls(name, params, args, extra)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "hooks.def"
#pragma GCC diagnostic pop
#undef GS_HOOK

static int has_ctx(void);

STUB_EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    has_ctx(); /* the thread that initializes is the first */
    pthread_once(&once, init);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return CUDA_SUCCESS;
}

/* GPUSHARE_STUB_THREAD_CTX=1: threads other than the first start without a
 * current context (as the CUDA runtime leaves some of its callers' threads);
 * pushing one makes it current until it is popped. Otherwise every thread has it. */
static __thread int pushed_ctx;
static pthread_t first_thread;
static atomic_int first_set;

static int has_ctx(void)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&first_set, &expect, 1))
        first_thread = pthread_self();
    const char *v = getenv("GPUSHARE_STUB_THREAD_CTX");
    return pushed_ctx > 0 || v == NULL || *v != '1' || pthread_equal(pthread_self(), first_thread);
}

__attribute__((visibility("hidden"))) int stub_has_ctx(void);
__attribute__((visibility("hidden"))) int stub_has_ctx(void)
{
    return has_ctx();
}

STUB_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    *pctx = has_ctx() ? fake_ctx() : NULL;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    int d = dev_of_ctx(ctx);
    if (d < 0 || pushed_ctx >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    push_stack[pushed_ctx++] = cur_dev;
    cur_dev = d;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    if (pctx)
        *pctx = fake_ctx();
    if (pushed_ctx > 0)
        cur_dev = push_stack[--pushed_ctx];
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
STUB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    int d = dev_of_ctx(ctx);
    if (d < 0)
        return CUDA_ERROR_INVALID_VALUE;
    cur_dev = d;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetCount(int *n);
STUB_EXPORT CUresult cuDeviceGetCount(int *n)
{
    *n = ndevices();
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
    if (d < 0 || d >= ndevices())
        return CUDA_ERROR_INVALID_VALUE;
    memset(u->bytes, 0, sizeof(u->bytes));
    u->bytes[15] = (char)d;
    return CUDA_SUCCESS;
}

/* A stream is its creating device's: the device is in the handle's low bits (stub_vmm.c). */
STUB_EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    uintptr_t v = (uintptr_t)s;
    *pctx = v <= 0x2 ? fake_ctx() : ctx_of((int)(v & 0xf));
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxSynchronize(void)
{
    pthread_once(&once, init);
    /* The real driver refuses it during any capture of the context and invalidates the capture. */
    if (stub_capture_conflict("cuCtxSynchronize-during-capture", NULL, 1) != CUDA_SUCCESS)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    while (qhead != qtail)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress: pick a variant by name, flags and version, like the driver ---- */
#define STUB_ENTRY(name) {#name, (void *)&name},
#define STUB_ENTRY_ANY(name, params, args, extra) STUB_ENTRY(name)
#define STUB_T_WORK STUB_ENTRY_ANY
#define STUB_T_SWORK STUB_ENTRY_ANY
#define STUB_T_COPY STUB_ENTRY_ANY
#define STUB_T_SCOPY STUB_ENTRY_ANY
#define STUB_T_CAPBEGIN STUB_ENTRY_ANY
#define STUB_T_CAPEND STUB_ENTRY_ANY
#define STUB_T_CTXNEW STUB_ENTRY_ANY
#define STUB_T_CTXGONE STUB_ENTRY_ANY
#define STUB_T_DEVGONE STUB_ENTRY_ANY
#define STUB_T_LAUNCH STUB_ENTRY_ANY
#define STUB_T_PROC STUB_ENTRY_ANY
#define STUB_T_USE STUB_ENTRY_ANY
#define STUB_T_MM STUB_ENTRY_ANY
STUB_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
STUB_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags);
STUB_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus);
static const struct {
    const char *name;
    void *fn;
} table[] = {
#define GS_HOOK(cls, name, params, args, extra) STUB_T_##cls(name, params, args, extra)
#include "hooks.def"
#undef GS_HOOK
    STUB_ENTRY(cuInit) STUB_ENTRY(cuDriverGetVersion) STUB_ENTRY(cuGraphInstantiateWithFlags)};

static void *lookup(const char *name)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].fn;
    return NULL;
}

static void *pick(const char *symbol, int cudaVersion, cuuint64_t flags)
{
    char n[160];
    void *p = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        static const char *const sfx[] = {"_v2_ptds", "_v2_ptsz", "_ptds", "_ptsz"};
        for (int i = 0; i < 4 && !p; i++) {
            snprintf(n, sizeof(n), "%s%s", symbol, sfx[i]);
            p = lookup(n);
        }
    }
    if (!p && cudaVersion >= 3020) {
        snprintf(n, sizeof(n), "%s_v2", symbol);
        p = lookup(n);
    }
    return p ? p : lookup(symbol);
}

STUB_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    /* v1 never existed as _v2 of itself: "cuGetProcAddress" resolves to the v1 entry. */
    *pfn = strcmp(symbol, "cuGetProcAddress") == 0 ? (void *)&cuGetProcAddress : pick(symbol, cudaVersion, flags);
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

STUB_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    *pfn = pick(symbol, cudaVersion, flags);
    if (symbolStatus)
        *symbolStatus = *pfn ? 0 : 1;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
