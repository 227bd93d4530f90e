/*
 * The stub driver's stream capture, with the rules the real driver enforces, so that a shim that
 * makes a call the driver refuses during capture fails the tests as it would fail on a GPU:
 *   - a capture has a mode (global, thread-local, relaxed) and the thread that began it; each thread
 *     has an interaction mode (cuThreadExchangeStreamCaptureMode, global by default);
 *   - a "potentially unsafe" call (page-locking, allocating or freeing memory, synchronous copies,
 *     cuMemGetInfo) is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when the calling thread is
 *     not relaxed and either began a non-relaxed capture itself or, in global mode, another thread
 *     runs a global-mode capture;
 *   - a call that conflicts with any capture (cuCtxSynchronize, synchronizing a capturing or the
 *     legacy stream, a synchronous copy or memset on the legacy stream) is refused in every mode;
 *   - a refusal invalidates the captures concerned: cuStreamEndCapture then fails with
 *     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and each refusal writes "X <pid> <ns> <call>" to the
 *     trace (GPUSHARE_STUB_TRACE).
 * Work queued on a capturing stream (the XOR kernel, asynchronous copies) is recorded, not run; the
 * graph cuStreamEndCapture returns runs it again at each cuGraphLaunch (the stub's graphs are their
 * own executables: cuGraphInstantiateWithFlags hands the graph back).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"

#define STUB_EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

CUresult stub_enqueue(const char *name, void (*fn)(uint64_t *), uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3,
                      int wait);
HIDDEN void stub_trace(char kind, const char *name);
HIDDEN int stub_has_ctx(void);

struct op {
    const char *name;
    void (*fn)(uint64_t *);
    uint64_t a[4];
};

struct graph {
    struct op *ops;
    int n, cap;
};

#define MAXCAP 16
static struct capture {
    int on;
    CUstream s;
    int mode;
    pthread_t owner;
    int invalid;
    struct graph *g;
} caps[MAXCAP];
static pthread_mutex_t cmu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int active; /* captures on: with none, work is never recorded (no lock per launch) */
static __thread int thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static CUresult begin(CUstream s, int mode)
{
    pthread_mutex_lock(&cmu);
    for (int i = 0; i < MAXCAP; i++)
        if (!caps[i].on) {
            caps[i] = (struct capture){1, s, mode, pthread_self(), 0, calloc(1, sizeof(struct graph))};
            atomic_fetch_add(&active, 1);
            pthread_mutex_unlock(&cmu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&cmu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

STUB_EXPORT CUresult cuStreamBeginCapture(CUstream s);
STUB_EXPORT CUresult cuStreamBeginCapture(CUstream s) { return begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }
STUB_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s);
STUB_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) { return begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }
STUB_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
STUB_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) { return begin(s, mode); }
STUB_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
STUB_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) { return begin(s, mode); }
STUB_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode);
STUB_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode)
{
    (void)g, (void)deps, (void)edges, (void)n;
    return begin(s, mode);
}
STUB_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                      const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode);
STUB_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                      const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode)
{
    return cuStreamBeginCaptureToGraph(s, g, deps, edges, n, mode);
}

static CUresult end(CUstream s, CUgraph *out)
{
    pthread_mutex_lock(&cmu);
    for (int i = 0; i < MAXCAP; i++)
        if (caps[i].on && caps[i].s == s) {
            caps[i].on = 0;
            atomic_fetch_sub(&active, 1);
            int invalid = caps[i].invalid;
            struct graph *g = caps[i].g;
            pthread_mutex_unlock(&cmu);
            if (invalid) {
                free(g->ops);
                free(g);
                if (out)
                    *out = NULL;
                return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
            }
            if (out)
                *out = (CUgraph)g;
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&cmu);
    return CUDA_ERROR_INVALID_VALUE; /* not capturing */
}

STUB_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
STUB_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end(s, g); }
STUB_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
STUB_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end(s, g); }

STUB_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status);
STUB_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
    if (s == NULL && !stub_has_ctx())
        return CUDA_ERROR_INVALID_CONTEXT; /* the legacy stream is the current context's */
    int st = CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_lock(&cmu);
    for (int i = 0; i < MAXCAP; i++)
        if (caps[i].on && caps[i].s == s && s != NULL)
            st = caps[i].invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&cmu);
    *status = st;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
STUB_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* A potentially unsafe call: 0, or the refusal (the captures that forbid it are invalidated). */
HIDDEN CUresult stub_capture_unsafe(const char *name)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    int refused = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&cmu);
    for (int i = 0; i < MAXCAP; i++) {
        struct capture *c = &caps[i];
        if (!c->on)
            continue;
        int mine = pthread_equal(c->owner, self);
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalid = 1;
            refused = 1;
        }
    }
    pthread_mutex_unlock(&cmu);
    if (!refused)
        return CUDA_SUCCESS;
    stub_trace('X', name);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* A call that conflicts with capture: with s (or, for s == NULL with legacy set, any stream of the
 * context) capturing, refused in every mode, and every capture concerned is invalidated. */
HIDDEN CUresult stub_capture_conflict(const char *name, CUstream s, int any)
{
    int refused = 0;
    pthread_mutex_lock(&cmu);
    for (int i = 0; i < MAXCAP; i++)
        if (caps[i].on && (any || caps[i].s == s)) {
            caps[i].invalid = 1;
            refused = 1;
        }
    pthread_mutex_unlock(&cmu);
    if (!refused)
        return CUDA_SUCCESS;
    stub_trace('X', name);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* Work on stream s: 1 if s captures (the work is recorded into its graph, not run). */
HIDDEN int stub_capture_record(CUstream s, const char *name, void (*fn)(uint64_t *), uint64_t a0, uint64_t a1,
                               uint64_t a2, uint64_t a3)
{
    int rec = 0;
    if (atomic_load(&active) == 0)
        return 0;
    pthread_mutex_lock(&cmu);
    for (int i = 0; i < MAXCAP && !rec; i++) {
        struct capture *c = &caps[i];
        if (!c->on || c->s != s || s == NULL)
            continue;
        rec = 1;
        struct graph *g = c->g;
        if (g->n == g->cap) {
            int cap = g->cap ? g->cap * 2 : 16;
            struct op *n = realloc(g->ops, (size_t)cap * sizeof(*n));
            if (n == NULL) {
                c->invalid = 1;
                break;
            }
            g->ops = n;
            g->cap = cap;
        }
        g->ops[g->n++] = (struct op){name, fn, {a0, a1, a2, a3}};
    }
    pthread_mutex_unlock(&cmu);
    return rec;
}

STUB_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags);
STUB_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
    (void)flags;
    *exec = (CUgraphExec)g;
    return g != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STUB_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s);
STUB_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    (void)s;
    struct graph *g = (struct graph *)exec;
    if (g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    stub_enqueue("cuGraphLaunch", NULL, 0, 0, 0, 0, 0);
    for (int i = 0; i < g->n; i++)
        stub_enqueue(g->ops[i].name, g->ops[i].fn, g->ops[i].a[0], g->ops[i].a[1], g->ops[i].a[2], g->ops[i].a[3], 0);
    return CUDA_SUCCESS;
}
