/*
 * The stream-ordered allocator, swappable (PyTorch's backend:cudaMallocAsync).
 *
 * The driver's pools hand out memory we cannot move, so with
 * oversubscription on the shim is the pool: cuMemAllocAsync and
 * cuMemAllocFromPoolAsync on the device's default pool allocate swappable
 * memory (mm.c) at once, which is valid in the stream's order and before it.
 * cuMemFreeAsync keeps the memory with an event recorded on the freeing
 * stream. A later allocation of the same size reuses it on the same stream at
 * once (stream order makes that safe, as the driver's pool does) and on any
 * other stream once the event has completed. Kept memory counts in the
 * working set, like a pool whose release threshold is never reached (what
 * PyTorch sets); it is the first to go, without a copy, when the process is
 * evicted, when it needs room in its reservation, and at cuMemPoolTrimTo.
 * cuMemPoolGetAttribute answers the pool's usage counters from this cache.
 *
 * Passed through to the driver, neither swapped nor counted (one warning):
 * allocations on a capturing stream (they become graph memory nodes) and
 * allocations from pools the application created itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm_internal.h"

struct kept {
    CUdeviceptr p;
    size_t n;
    CUstream s;
    CUcontext ctx;
    int slot; /* the GPU whose working set counts it */
    CUevent ev; /* NULL: freed during a capture; reusable only after the context is synchronized */
};

static struct kept *kept;
static int nkept, capkept;
static uint64_t reused, fresh;
static atomic_ullong passed; /* allocations left to the driver */
static CUevent spare[64];
static int nspare;

static void warn_passthrough(const char *why)
{
    static atomic_int warned;
    gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
           "stream-ordered allocation passed to the driver: %s; that memory is neither swapped nor counted in "
           "the GPU budget",
           why);
}

static CUstream norm_stream(CUstream s, int ptsz)
{
    if (s == (CUstream)0x1)
        return NULL; /* CU_STREAM_LEGACY is the NULL stream */
    return ptsz && s == NULL ? CU_STREAM_PER_THREAD : s;
}

/* 0, or why the stream's allocations cannot be ours (in why, for the log). */
static int capturing(CUstream s, char *why, size_t len)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult e = REAL(cuStreamIsCapturing)(s, &st);
    if (e == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE)
        return 0;
    if (e != CUDA_SUCCESS)
        snprintf(why, len, "cuStreamIsCapturing(%p) failed with CUDA error %d", (void *)s, e);
    else
        snprintf(why, len, "stream %p is capturing (a graph memory node; capture status %d)", (void *)s, st);
    return 1;
}

/* Is pool (NULL: the device's current one) the device's default pool, which we stand in for? */
static int default_pool(CUmemoryPool pool)
{
    CUdevice dev;
    CUmemoryPool def = NULL;
    if (REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS || REAL(cuDeviceGetDefaultMemPool)(&def, dev) != CUDA_SUCCESS)
        return 0;
    if (pool == NULL && REAL(cuDeviceGetMemPool)(&pool, dev) != CUDA_SUCCESS)
        return 0;
    return pool == def;
}

/*
 * The CUDA runtime calls the stream-ordered allocator from threads with no
 * current driver context (PyTorch's autograd threads, seen on the H100: the
 * stream queries then fail with CUDA_ERROR_INVALID_CONTEXT). A process of one
 * context gets it made current for the call. With several GPUs (the list
 * form) the stream's context is made current when another is: the memory is
 * the stream's device's, made and later swapped in that context. Returns the
 * context to pop, or NULL.
 */
static CUcontext enter_ctx(CUstream s)
{
    CUcontext c = NULL;
    int have = REAL(cuCtxGetCurrent)(&c) == CUDA_SUCCESS && c != NULL;
    if (gs_multi && s != NULL && s != CU_STREAM_PER_THREAD) {
        CUcontext sc = NULL;
        if (REAL(cuStreamGetCtx)(s, &sc) == CUDA_SUCCESS && sc != NULL && sc != c)
            return REAL(cuCtxPushCurrent_v2)(sc) == CUDA_SUCCESS ? sc : NULL;
    }
    if (have)
        return NULL;
    c = gs_ctx_only();
    return c != NULL && REAL(cuCtxPushCurrent_v2)(c) == CUDA_SUCCESS ? c : NULL;
}

static void leave_ctx(CUcontext pushed)
{
    CUcontext c;
    if (pushed != NULL)
        REAL(cuCtxPopCurrent_v2)(&c);
}

static void put_event_locked(CUevent ev)
{
    if (ev == NULL)
        return;
    if (nspare < (int)(sizeof(spare) / sizeof(spare[0])))
        spare[nspare++] = ev;
    else
        REAL(cuEventDestroy_v2)(ev);
}

static CUevent get_event_locked(void)
{
    if (nspare > 0)
        return spare[--nspare];
    CUevent ev = NULL;
    if (REAL(cuEventCreate)(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return ev;
}

static void remove_kept_locked(int i)
{
    mm_devs[kept[i].slot].kept_bytes -= kept[i].n;
    kept[i] = kept[--nkept];
}

int mm_async_cached_locked(CUdeviceptr d)
{
    for (int i = 0; i < nkept; i++)
        if (kept[i].p == d)
            return 1;
    return 0;
}

static void set_vacant_locked(CUdeviceptr p, int v)
{
    int i = mm_find_region_locked(p);
    if (i >= 0 && !mm_regions[i]->slab)
        mm_regions[i]->vacant = v;
}

/* How much the working set shrank since start (other threads may have grown it while mm_mu was released). */
static uint64_t shrunk(uint64_t start)
{
    uint64_t now = mm_need_locked();
    return start > now ? start - now : 0;
}

uint64_t mm_async_drop_locked(int wait, uint64_t goal)
{
    uint64_t start = mm_need_locked();
    /* completed ones first; the ones the GPU may still use only when waiting is allowed */
    for (int pass = 0; pass < 2 && shrunk(start) < goal; pass++) {
        for (int i = nkept - 1; i >= 0 && shrunk(start) < goal; i--) {
            if (i >= nkept)
                continue; /* mm_mu was released while a region was freed: the list changed */
            struct kept k = kept[i];
            if (k.slot != gs_dev_cur)
                continue; /* another GPU's: its working set is not the one to shrink */
            if (pass == 0 && (k.ev == NULL || REAL(cuEventQuery)(k.ev) != CUDA_SUCCESS))
                continue;
            remove_kept_locked(i); /* off the list: no other thread reuses or drops it meanwhile */
            if (pass == 1) {
                if (!wait || gs_capturing()) {
                    kept[nkept++] = k; /* the list never shrinks below its capacity: room for it */
                    MMD->kept_bytes += k.n;
                    break;
                }
                /* Waiting for the GPU without mm_mu (mm.c's invariant); the list is read afresh after. */
                pthread_mutex_unlock(&mm_mu);
                if (k.ev != NULL)
                    REAL(cuEventSynchronize)(k.ev);
                else
                    mm_sync_ctx(k.ctx);
                pthread_mutex_lock(&mm_mu);
            }
            put_event_locked(k.ev);
            set_vacant_locked(k.p, 0);
            CUresult res;
            mm_free_locked(k.p, 0, &res);
        }
    }
    return shrunk(start);
}

/* Memory freed earlier that this allocation may reuse now. */
static int take_locked(size_t n, CUstream s, CUcontext ctx, CUdeviceptr *out)
{
    int same = 0, noev = 0, busy = 0, other = 0;
    for (int i = 0; i < nkept; i++) {
        struct kept *k = &kept[i];
        if (k->n != n || k->slot != gs_dev_cur)
            continue;
        same++;
        if (k->ctx != ctx || k->ev == NULL) {
            other += k->ctx != ctx;
            noev += k->ev == NULL;
            continue;
        }
        if (k->s != s && REAL(cuEventQuery)(k->ev) != CUDA_SUCCESS) {
            busy++;
            continue;
        }
        *out = k->p;
        put_event_locked(k->ev);
        remove_kept_locked(i);
        set_vacant_locked(*out, 0);
        return 1;
    }
    gs_log(GS_LOG_DEBUG,
           "stream-ordered allocation of %zu bytes on stream %p: nothing to reuse (%d kept: %d without an event, "
           "%d of another context, %d still in use on another stream; %d kept in all)",
           n, (void *)s, same, noev, other, busy, nkept);
    return 0;
}

static void count_live_locked(size_t n)
{
    struct mm_dev *m = MMD;
    m->live += n;
    if (m->live > m->live_high)
        m->live_high = m->live;
    if (m->live + m->kept_bytes > m->reserved_high)
        m->reserved_high = m->live + m->kept_bytes;
}

static CUresult alloc_async(int id, CUdeviceptr *dptr, size_t n, int from_pool, CUmemoryPool pool, CUstream s,
                            int ptsz)
{
    void *real = gs_real(id);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUstream given = s;
    s = norm_stream(s, ptsz);
    for (;;) {
        int gd = gs_gate_enter(id);
        CUcontext pushed = enter_ctx(s);
        int on = gs_mm_here() && dptr != NULL && n > 0;
        char why[128] = "";
        if (on && !capturing(s, why, sizeof(why)) && !default_pool(from_pool ? pool : NULL))
            snprintf(why, sizeof(why), "a memory pool the application created");
        if (!on || why[0] != '\0') {
            if (why[0] != '\0') {
                warn_passthrough(why);
                atomic_fetch_add(&passed, 1);
            }
            leave_ctx(pushed);
            CUresult r = from_pool ? ((gs_fn_cuMemAllocFromPoolAsync)real)(dptr, n, pool, given)
                                   : ((gs_fn_cuMemAllocAsync)real)(dptr, n, given);
            gs_gate_leave(gd);
            return r;
        }
        CUcontext ctx = NULL;
        REAL(cuCtxGetCurrent)(&ctx);
        pthread_mutex_lock(&mm_mu);
        int hit = take_locked(n, s, ctx, dptr);
        if (hit) {
            reused++;
            count_live_locked(n);
        }
        pthread_mutex_unlock(&mm_mu);
        if (hit) {
            leave_ctx(pushed);
            gs_gate_leave(gd);
            return CUDA_SUCCESS;
        }
        int yield;
        CUresult r = gs_mm_alloc(dptr, n, 0, &yield); /* one region: kept and reused whole */
        if (r == CUDA_SUCCESS) {
            pthread_mutex_lock(&mm_mu);
            fresh++;
            count_live_locked(n);
            pthread_mutex_unlock(&mm_mu);
        }
        leave_ctx(pushed);
        gs_gate_leave(gd);
        if (!yield)
            return r;
        gs_gate_yield(); /* others hold the memory: give the GPU back, wait in line with the larger need */
    }
}

/* Frees d after waiting for wait_ev (else the stream s, else the context), with mm_mu released. */
static CUresult free_after_locked(CUdeviceptr d, CUevent wait_ev, CUstream s, CUcontext ctx)
{
    CUresult r = CUDA_SUCCESS;
    if (gs_capturing()) {
        /* Waiting for the GPU is not allowed now; fail open: the memory stays allocated. */
        gs_log(GS_LOG_WARN, "stream-ordered free of 0x%llx during a stream capture could not be followed: the "
                            "memory stays allocated", (unsigned long long)d);
        put_event_locked(wait_ev);
        return r;
    }
    pthread_mutex_unlock(&mm_mu);
    if (wait_ev != NULL)
        REAL(cuEventSynchronize)(wait_ev);
    else if (s != NULL)
        REAL(cuStreamSynchronize)(s);
    else
        mm_sync_ctx(ctx);
    pthread_mutex_lock(&mm_mu);
    put_event_locked(wait_ev);
    set_vacant_locked(d, 0);
    mm_free_locked(d, 0, &r); /* looked up again */
    return r;
}

/* Keeps freed memory for reuse, behind an event on the freeing stream; frees it (after waiting for
 * the stream, mm_mu released) when the stream cannot be followed or the list cannot grow. During a
 * capture it is kept without an event (reusable once the context was synchronized). */
static CUresult keep_locked(CUdeviceptr d, const struct gs_mm_info *in, CUstream s)
{
    CUevent ev = NULL;
    char why[128];
    if (!capturing(s, why, sizeof(why))) {
        ev = get_event_locked();
        if (ev == NULL || REAL(cuEventRecord)(ev, s) != CUDA_SUCCESS) {
            put_event_locked(ev);
            ev = NULL;
            if (!gs_capturing())
                return free_after_locked(d, NULL, s == NULL ? (CUstream)0x1 : s, in->ctx);
        }
    }
    if (nkept == capkept) {
        int cap = capkept ? capkept * 2 : 64;
        struct kept *nk = realloc(kept, (size_t)cap * sizeof(*nk));
        if (nk != NULL) {
            kept = nk;
            capkept = cap;
        }
    }
    gs_log(GS_LOG_DEBUG, "stream-ordered free of %zu bytes at 0x%llx on stream %p", in->size,
           (unsigned long long)d, (void *)s);
    if (nkept < capkept) {
        kept[nkept++] = (struct kept){.p = d, .n = in->size, .s = s, .ctx = in->ctx, .slot = in->slot, .ev = ev};
        mm_devs[in->slot].kept_bytes += in->size;
        set_vacant_locked(d, 1);
        return CUDA_SUCCESS;
    }
    return free_after_locked(d, ev, NULL, in->ctx);
}

static CUresult free_async(int id, CUdeviceptr d, CUstream s, int ptsz)
{
    gs_fn_cuMemFreeAsync real = (gs_fn_cuMemFreeAsync)gs_real(id);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUstream given = s;
    s = norm_stream(s, ptsz);
    int gd = gs_gate_enter(id);
    struct gs_mm_info in;
    if (!gs_mm_here() || !gs_mm_lookup(d, &in)) {
        CUresult r = real(d, given);
        gs_gate_leave(gd);
        return r;
    }
    CUresult r = CUDA_SUCCESS;
    CUcontext pushed = enter_ctx(s);
    pthread_mutex_lock(&mm_mu);
    if (in.base != d || mm_async_cached_locked(d)) {
        r = CUDA_ERROR_INVALID_VALUE; /* not the start of an allocation, or freed already */
    } else {
        r = keep_locked(d, &in, s);
        struct mm_dev *m = &mm_devs[in.slot];
        m->live -= in.size < m->live ? in.size : m->live;
    }
    pthread_mutex_unlock(&mm_mu);
    leave_ctx(pushed);
    gs_gate_leave(gd);
    return r;
}

/* The memory limit charges the bytes asked for: the driver's pool (or, with oversubscription, the
 * shim's cache) keeps freed memory for reuse, and that reserve is shared by later allocations, so
 * only what is allocated and not yet freed is the application's. cuMemFreeAsync gives the bytes back;
 * a pool trim has nothing more to give. */
static CUresult alloc_capped(int id, CUdeviceptr *dptr, size_t n, int from_pool, CUmemoryPool pool, CUstream s,
                             int ptsz)
{
    if (GS_LIKELY(!gs_cap_on()) || dptr == NULL || n == 0)
        return alloc_async(id, dptr, n, from_pool, pool, s, ptsz);
    CUresult r = gs_cap_charge(n);
    if (r != CUDA_SUCCESS)
        return r;
    r = alloc_async(id, dptr, n, from_pool, pool, s, ptsz);
    gs_cap_done(r, GS_CAP_PTR, r == CUDA_SUCCESS ? *dptr : 0, n);
    return r;
}

static CUresult free_capped(int id, CUdeviceptr d, CUstream s, int ptsz)
{
    if (GS_LIKELY(!gs_cap_on()))
        return free_async(id, d, s, ptsz);
    struct gs_cap_free f;
    gs_cap_free_begin(GS_CAP_PTR, d, &f);
    CUresult r = free_async(id, d, s, ptsz);
    gs_cap_free_end(&f, r);
    return r;
}

GS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    gs_dev_pick_stream(s);
    return alloc_capped(GS_ID_cuMemAllocAsync, dptr, n, 0, NULL, s, 0);
}

GS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    gs_dev_pick_stream(s);
    return alloc_capped(GS_ID_cuMemAllocAsync_ptsz, dptr, n, 0, NULL, s, 1);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    gs_dev_pick_stream(s);
    return alloc_capped(GS_ID_cuMemAllocFromPoolAsync, dptr, n, 1, pool, s, 0);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    gs_dev_pick_stream(s);
    return alloc_capped(GS_ID_cuMemAllocFromPoolAsync_ptsz, dptr, n, 1, pool, s, 1);
}

GS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s)
{
    gs_dev_pick_ptr(d);
    return free_capped(GS_ID_cuMemFreeAsync, d, s, 0);
}

GS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s)
{
    gs_dev_pick_ptr(d);
    return free_capped(GS_ID_cuMemFreeAsync_ptsz, d, s, 1);
}

static int ours(CUmemoryPool pool)
{
    return gs_mm_here() && default_pool(pool);
}

GS_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    gs_dev_pick();
    gs_fn_cuMemPoolTrimTo real = (gs_fn_cuMemPoolTrimTo)gs_real(GS_ID_cuMemPoolTrimTo);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ours(pool)) {
        pthread_mutex_lock(&mm_mu);
        struct mm_dev *m = MMD;
        if (m->live + m->kept_bytes > keep)
            mm_async_drop_locked(1, m->live + m->kept_bytes - keep);
        pthread_mutex_unlock(&mm_mu);
    }
    return real(pool, keep);
}

GS_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    gs_dev_pick();
    gs_fn_cuMemPoolGetAttribute real = (gs_fn_cuMemPoolGetAttribute)gs_real(GS_ID_cuMemPoolGetAttribute);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (value == NULL || attr < CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attr > CU_MEMPOOL_ATTR_USED_MEM_HIGH ||
        !ours(pool))
        return real(pool, attr, value);
    pthread_mutex_lock(&mm_mu);
    struct mm_dev *m = MMD;
    uint64_t v = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? m->live + m->kept_bytes
                 : attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH  ? m->reserved_high
                 : attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT   ? m->live
                                                              : m->live_high;
    pthread_mutex_unlock(&mm_mu);
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    gs_dev_pick();
    gs_fn_cuMemPoolSetAttribute real = (gs_fn_cuMemPoolSetAttribute)gs_real(GS_ID_cuMemPoolSetAttribute);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    if ((attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) && value != NULL &&
        ours(pool)) {
        /* the driver's rule: only a reset (to 0), which starts the high-water mark at the current value */
        pthread_mutex_lock(&mm_mu);
        struct mm_dev *m = MMD;
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            m->reserved_high = m->live + m->kept_bytes;
        else
            m->live_high = m->live;
        pthread_mutex_unlock(&mm_mu);
    }
    return real(pool, attr, value);
}

void mm_async_stats_locked(uint64_t *reuse, uint64_t *fresh_allocs, uint64_t *passed_through)
{
    *reuse = reused;
    *fresh_allocs = fresh;
    *passed_through = atomic_load(&passed);
}

void mm_async_atfork_child(void)
{
    /* CUDA does not survive fork: nothing the parent kept is ours to free. */
    kept = NULL;
    nkept = capkept = 0;
    nspare = 0;
    reused = fresh = 0; /* the per-GPU pool counters are mm.c's to reset */
    atomic_store(&passed, 0);
}
