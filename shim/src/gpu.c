/*
 * Quiescing the GPU before the lock goes to someone else: the contexts this
 * process created or retained, and the streams it is capturing (which must
 * never be synchronized: cuCtxSynchronize from another thread invalidates a
 * global-mode capture). Touched only when contexts or captures come and go
 * and at a release, never per launch.
 *
 * Captures are counted (gs_captures) from the shim's own hooks of every
 * cuStreamBeginCapture variant and cuStreamEndCapture, whatever the capture
 * mode, rather than asked of the driver: cuStreamIsCapturing answers for one
 * stream (and for the legacy or per-thread stream only on the capturing
 * thread), and cuThreadExchangeStreamCaptureMode says how the calling thread
 * is bound, not whether another captures. Counting every capture the same
 * way covers global mode (which binds every thread, the shim's included),
 * thread-local and relaxed captures, and captures on several threads at once;
 * a capture whose end we never saw is dropped from the count the next time
 * the set is checked with the driver (gs_capture_active).
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "internal.h"

#define GS_MAX_CTX 32
#define GS_MAX_CAPTURE 64

static pthread_mutex_t set_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctxs[GS_MAX_CTX];
static int nctx;
static CUstream caps[GS_MAX_CAPTURE];
static int ncap;
static int cap_overflow; /* a capture we could not record: assume one is running */

void gs_ctx_add(CUcontext ctx)
{
    if (ctx == NULL)
        return;
    pthread_mutex_lock(&set_mu);
    int known = 0;
    for (int i = 0; i < nctx; i++)
        known |= ctxs[i] == ctx;
    if (!known && nctx < GS_MAX_CTX)
        ctxs[nctx++] = ctx;
    else if (!known)
        gs_log(GS_LOG_WARN, "more than %d CUDA contexts; context %p is not synchronized at hand-off", GS_MAX_CTX, (void *)ctx);
    pthread_mutex_unlock(&set_mu);
}

void gs_ctx_remove(CUcontext ctx)
{
    pthread_mutex_lock(&set_mu);
    for (int i = 0; i < nctx; i++)
        if (ctxs[i] == ctx) {
            ctxs[i] = ctxs[--nctx];
            break;
        }
    pthread_mutex_unlock(&set_mu);
}

CUcontext gs_ctx_only(void)
{
    pthread_mutex_lock(&set_mu);
    CUcontext c = nctx == 1 ? ctxs[0] : NULL;
    pthread_mutex_unlock(&set_mu);
    return c;
}

void gs_ctx_record_current(void)
{
    gs_fn_cuCtxGetCurrent get = (gs_fn_cuCtxGetCurrent)gs_real(GS_ID_cuCtxGetCurrent);
    CUcontext c = NULL;
    if (get != NULL && get(&c) == CUDA_SUCCESS && c != NULL)
        gs_ctx_add(c);
}

atomic_int gs_captures;
static atomic_int unsafe_inflight; /* shim threads inside a call that a capture forbids */

void gs_capture_begin(void)
{
    atomic_fetch_add_explicit(&gs_captures, 1, memory_order_seq_cst);
    /* A stager's page-lock takes a few ms at most (its pages are faulted in beforehand). */
    for (int spins = 0; atomic_load_explicit(&unsafe_inflight, memory_order_seq_cst) > 0; spins++) {
        if (spins < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

void gs_capture_begun(CUstream s, CUresult r)
{
    if (r != CUDA_SUCCESS) {
        atomic_fetch_sub(&gs_captures, 1);
        return;
    }
    pthread_mutex_lock(&set_mu);
    if (ncap < GS_MAX_CAPTURE)
        caps[ncap++] = s;
    else
        cap_overflow++;
    pthread_mutex_unlock(&set_mu);
}

int gs_unsafe_begin(void)
{
    atomic_fetch_add_explicit(&unsafe_inflight, 1, memory_order_seq_cst);
    if (!gs_capturing())
        return 1;
    atomic_fetch_sub_explicit(&unsafe_inflight, 1, memory_order_seq_cst);
    return 0;
}

void gs_unsafe_end(void)
{
    atomic_fetch_sub_explicit(&unsafe_inflight, 1, memory_order_release);
}

void gs_thread_relax_capture(void)
{
    gs_fn_cuThreadExchangeStreamCaptureMode x =
        (gs_fn_cuThreadExchangeStreamCaptureMode)gs_real(GS_ID_cuThreadExchangeStreamCaptureMode);
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (x != NULL)
        x(&m);
}

void gs_capture_remove(CUstream s)
{
    pthread_mutex_lock(&set_mu);
    int found = 0;
    for (int i = 0; i < ncap; i++)
        if (caps[i] == s) {
            caps[i] = caps[--ncap];
            found = 1;
            break;
        }
    if (!found && cap_overflow > 0) {
        cap_overflow--;
        found = 1;
    }
    if (found)
        atomic_fetch_sub(&gs_captures, 1);
    pthread_mutex_unlock(&set_mu);
}

/* The legacy (0x1) and per-thread (0x2) default streams mean the calling
 * thread's stream: they cannot be queried from the shim's thread, so a
 * capture on them counts as active until cuStreamEndCapture. */
static int is_thread_relative(CUstream s)
{
    uintptr_t v = (uintptr_t)s;
    return v == 0 || v == 1 || v == 2;
}

int gs_capture_active(void)
{
    gs_fn_cuStreamIsCapturing is_cap = (gs_fn_cuStreamIsCapturing)gs_real(GS_ID_cuStreamIsCapturing);
    pthread_mutex_lock(&set_mu);
    int active = cap_overflow > 0;
    for (int i = 0; i < ncap;) {
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        int capturing = 1;
        if (!is_thread_relative(caps[i]) && is_cap != NULL)
            capturing = is_cap(caps[i], &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
        if (!capturing) {
            caps[i] = caps[--ncap]; /* ended without us seeing cuStreamEndCapture */
            atomic_fetch_sub(&gs_captures, 1);
            continue;
        }
        active = 1;
        i++;
    }
    pthread_mutex_unlock(&set_mu);
    return active;
}

int gs_gpu_drain(void)
{
    if (gs_capture_active())
        return -1;
    gs_fn_cuCtxPushCurrent_v2 push = (gs_fn_cuCtxPushCurrent_v2)gs_real(GS_ID_cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = (gs_fn_cuCtxPopCurrent_v2)gs_real(GS_ID_cuCtxPopCurrent_v2);
    gs_fn_cuCtxSynchronize sync = (gs_fn_cuCtxSynchronize)gs_real(GS_ID_cuCtxSynchronize);
    if (push == NULL || pop == NULL || sync == NULL)
        return 0;
    CUcontext list[GS_MAX_CTX];
    pthread_mutex_lock(&set_mu);
    int n = nctx;
    for (int i = 0; i < n; i++)
        list[i] = ctxs[i];
    pthread_mutex_unlock(&set_mu);
    for (int i = 0; i < n; i++) {
        /* Several GPUs: a release waits for its own GPU's work only (another GPU's may wait on a peer). */
        if (gs_multi && gs_dev_slot_of_ctx(list[i]) != gs_dev_cur)
            continue;
        if (push(list[i]) != CUDA_SUCCESS)
            continue; /* destroyed or inactive primary context: nothing to wait for */
        CUresult r = sync();
        CUcontext popped;
        pop(&popped);
        if (r != CUDA_SUCCESS)
            gs_log(GS_LOG_DEBUG, "cuCtxSynchronize(%p) = %d at release", (void *)list[i], r);
    }
    return 0;
}

void gs_gpu_atfork_child(void)
{
    pthread_mutex_init(&set_mu, NULL);
    nctx = 0;
    ncap = 0;
    cap_overflow = 0;
    atomic_store(&gs_captures, 0);
    atomic_store(&unsafe_inflight, 0);
}
