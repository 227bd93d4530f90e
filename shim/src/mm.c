/*
 * The memory manager: device memory that can leave the GPU and come back at
 * the same address (oversubscription by explicit swap, docs/oversubscription.md).
 *
 * Active only when GPUSHARE_OVERSUB=1 and the scheduler grants a budget. Then
 * every cuMemAlloc_v2 / cuMemAllocPitch_v2 is backed by the virtual memory
 * management API: a reserved address range (cuMemAddressReserve) onto which a
 * physical allocation (cuMemCreate) is mapped (cuMemMap + cuMemSetAccess).
 * The address range never changes; the physical pages come and go:
 *   swap out  copy the range to host staging, unmap, release the pages;
 *   swap in   create pages, map them at the same address, copy back.
 * Host staging is reserved with the allocation (an anonymous mapping: an
 * allocation fails when the host cannot give it) and page-locked by the
 * stager thread in the background (cuMemHostRegister, in STAGE_CHUNK pieces
 * whose pages it faults in first without the driver), so neither the
 * allocating thread nor a hand-off waits for pinning; a swap of a range whose
 * staging is not pinned yet (or could not be pinned) copies through pageable
 * memory, slower but correct.
 * Requests below a quarter of the granularity are packed into slabs of one
 * granule (2 MiB on the H100), so a swap moves few large pieces.
 *
 * Physical residency is bounded by the reservation the scheduler grants
 * (GRANT / MEMREPLY); growing beyond it asks the scheduler first (MEMREQ).
 * The gate's background thread calls gs_mm_swap_in_all after a GRANT (which, after a partial
 * GRANT, maps more as RAISE messages come in) and
 * gs_mm_evict on EVICT, both with the process quiesced.
 *
 * Locks: mm_mu (regions, counters) may be held while taking the gate's mutex
 * (gs_gate_send), never the other way round; rep_mu is a leaf.
 * Invariant: an application thread never waits for the scheduler or the GPU
 * while it holds mm_mu. A thread that must wait (a MEMREPLY, a free's
 * cuCtxSynchronize, a stream-ordered free's event) marks what it waits for
 * under mm_mu (memreq_busy; an entry taken off a list), drops mm_mu, and
 * after taking it again reads the state afresh (working set, reservation,
 * where the pointer lives), so other threads' allocations and frees, the
 * stager and an eviction go on meanwhile. Only the background thread's swaps
 * copy with mm_mu held, while no application call is in flight (the gate is
 * closed), and a swap-in waits for RAISE with it released.
 *
 * Stream capture (internal.h, gs_capturing): while any stream captures,
 * nothing here page-locks, synchronizes or copies. A free that must wait
 * for the GPU (cuMemFree) is kept until the capture ended; an allocation
 * neither drops kept memory that the GPU may still use nor gives the GPU back
 * to grow (it fails with out of memory instead: a capturing process cannot
 * be quiesced); evictions wait (gate.c); memory allocated during capture is
 * swappable like any other, at an address that never changes, so a graph
 * replays correctly after it was swapped out and back in.
 */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpushare_proto.h"
#include "mm_internal.h"

#define SLAB_ALIGN 512
/* An eviction reports its progress each time it has released an eighth of what it moves, at most
 * this much: a message per 256 MiB segment, per 13 of PyTorch's 20 MiB blocks (the scheduler reads
 * NVML for each, ~1 ms, to check it). */
#define PROGRESS_BYTES ((uint64_t)256 << 20)
#define MAX_STREAMS 32
/* Regions an eviction copies out at once: bounded storage on the stack, whatever the region count. */
#define SWAP_BATCH 64

atomic_int gs_mm_on[GS_DEV_SLOTS];
struct mm_dev mm_devs[GS_DEV_SLOTS] = {
    [0 ... GS_DEV_SLOTS - 1] = {.rep_mu = PTHREAD_MUTEX_INITIALIZER, .memreq_cv = PTHREAD_COND_INITIALIZER},
};

pthread_mutex_t mm_mu = PTHREAD_MUTEX_INITIALIZER;
struct region **mm_regions; /* sorted by va */
int mm_nreg;
static int capreg;
size_t mm_gran; /* granularity, learnt at the first allocation */
int mm_handles;
static uint64_t next_id = 1;


static struct {
    CUcontext ctx;
    CUstream s;
} streams[MAX_STREAMS];
static int nstreams;

/* Frees that must wait for the GPU, made while a stream captured: done once no stream captures. */
static CUdeviceptr *deferred;
static int ndeferred_locked, capdeferred;
static atomic_int ndeferred;

/* rep_cv waits on the monotonic clock: a wall-clock step must not stretch or cut the bound. */
static void rep_cv_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    for (int i = 0; i < GS_DEV_SLOTS; i++)
        pthread_cond_init(&mm_devs[i].rep_cv, &a);
    pthread_condattr_destroy(&a);
    mm_stage_init();
}
static pthread_once_t rep_once = PTHREAD_ONCE_INIT;

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* The GPU's name in log lines, in the list form only (the single form's lines stay as they are). */
static const char *gpu_tag(void)
{
    return gs_multi ? gs_devs[gs_dev_cur].uuid : "";
}

void gs_mm_configure(uint64_t sched_budget, uint32_t sched_mode)
{
    if (gs_dev_cur == GS_DEV_NONE || MMD->state != MM_UNDECIDED)
        return;
    pthread_once(&rep_once, rep_cv_init); /* before any thread can wait for or answer a MEMREQ */
    MMD->state = MM_OFF;
    if (!gs_devs[gs_dev_cur].oversub)
        return;
    if (sched_budget == 0) {
        gs_log(GS_LOG_WARN, "GPUSHARE_OVERSUB=1 but the GPU scheduler grants no memory budget: "
                            "oversubscription is off, the GPU lock is on%s%s", gs_multi ? " on " : "", gpu_tag());
        return;
    }
    MMD->budget = sched_budget;
    if (gs_cfg.budget_cap != 0 && gs_cfg.budget_cap < MMD->budget)
        MMD->budget = gs_cfg.budget_cap;
    MMD->mode = sched_mode;
    MMD->state = MM_ACTIVE;
    atomic_store(&gs_mm_on[gs_dev_cur], 1);
    gs_log(GS_LOG_INFO, "oversubscription on%s%s: budget %llu bytes, mode %u", gs_multi ? " " : "", gpu_tag(),
           (unsigned long long)MMD->budget, MMD->mode);
}

uint64_t gs_mm_need(void)
{
    if (!gs_mm_here())
        return 0;
    return atomic_load(&MMD->need_bytes) + atomic_load(&MMD->pending_growth);
}

uint64_t gs_mm_resident(void)
{
    return atomic_load(&MMD->resident_bytes);
}

uint64_t gs_mm_swapped(void)
{
    return atomic_load(&MMD->swapped_bytes);
}

void gs_mm_rejoin(uint64_t *need, uint64_t *resident, uint64_t *swapped)
{
    atomic_store(&MMD->acks, 0);
    *need = atomic_load(&MMD->need_bytes);
    *resident = atomic_load(&MMD->resident_bytes);
    *swapped = atomic_load(&MMD->swapped_bytes);
    atomic_store(&MMD->reserved, *resident);
}

/* RAISE (protocol 3): the reservation of a holder filling in after a partial GRANT rose; the swap-in
 * waiting in gs_mm_swap_in_all (through gs_gate_pump, on the same thread) maps more. */
void gs_mm_on_raise(uint64_t res)
{
    atomic_store(&MMD->reserved, res);
    atomic_fetch_add(&MMD->acks, 1);
}

void gs_mm_on_reply(int raise, uint64_t res, uint32_t status)
{
    if (status != UINT32_MAX)
        atomic_store(&MMD->reserved, res);
    if (raise)
        atomic_fetch_add(&MMD->acks, 1);
    pthread_mutex_lock(&MMD->rep_mu);
    MMD->rep_seq++;
    MMD->rep_status = status;
    pthread_cond_broadcast(&MMD->rep_cv);
    pthread_mutex_unlock(&MMD->rep_mu);
}

/* ---- regions ---- */

int mm_find_region_locked(CUdeviceptr p)
{
    int lo = 0, hi = mm_nreg - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        struct region *r = mm_regions[mid];
        if (p < r->va)
            hi = mid - 1;
        else if (p >= r->va + r->size)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

static int insert_region_locked(struct region *r)
{
    if (mm_nreg == capreg) {
        int cap = capreg ? capreg * 2 : 64;
        struct region **n = realloc(mm_regions, (size_t)cap * sizeof(*n));
        if (n == NULL)
            return -1;
        mm_regions = n;
        capreg = cap;
    }
    int i = mm_nreg;
    while (i > 0 && mm_regions[i - 1]->va > r->va) {
        mm_regions[i] = mm_regions[i - 1];
        i--;
    }
    mm_regions[i] = r;
    mm_nreg++;
    return 0;
}

static void remove_region_locked(int i)
{
    memmove(&mm_regions[i], &mm_regions[i + 1], (size_t)(mm_nreg - i - 1) * sizeof(*mm_regions));
    mm_nreg--;
}

static CUstream stream_for_locked(CUcontext ctx)
{
    for (int i = 0; i < nstreams; i++)
        if (streams[i].ctx == ctx)
            return streams[i].s;
    CUstream s = NULL;
    if (REAL(cuStreamCreate) == NULL || REAL(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return NULL;
    if (nstreams < MAX_STREAMS) {
        streams[nstreams].ctx = ctx;
        streams[nstreams].s = s;
        nstreams++;
    }
    return s;
}

static CUmemAllocationProp prop_for(CUdevice dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

/* Maps r's pages at r->va, read-write for its device (a handle's only while they are copied). */
static CUresult map_at_va_locked(struct region *r)
{
    CUresult e = REAL(cuMemMap)(r->va, r->size, 0, r->h, 0);
    if (e != CUDA_SUCCESS)
        return e;
    CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = r->dev},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    e = REAL(cuMemSetAccess)(r->va, r->size, &d, 1);
    if (e != CUDA_SUCCESS)
        REAL(cuMemUnmap)(r->va, r->size);
    return e;
}

/* New physical pages for r, mapped at r->va. */
static CUresult map_locked(struct region *r)
{
    CUmemGenericAllocationHandle h;
    CUresult e = REAL(cuMemCreate)(&h, r->size, &r->prop, 0);
    if (e != CUDA_SUCCESS)
        return e;
    r->h = h;
    e = map_at_va_locked(r);
    if (e != CUDA_SUCCESS) {
        REAL(cuMemRelease)(h);
        return e;
    }
    r->resident = 1;
    return CUDA_SUCCESS;
}

/* Releases r's pages, which are mapped at r->va (plain memory always; a handle after a copy). */
static void unmap_locked(struct region *r)
{
    REAL(cuMemUnmap)(r->va, r->size);
    REAL(cuMemRelease)(r->h);
    r->resident = 0;
}

/* Releases r's pages wherever they are: at r->va, or an application handle's not mapped by us. */
static void release_pages_locked(struct region *r)
{
    if (r->handle && !r->atva) {
        REAL(cuMemRelease)(r->h);
        r->resident = 0;
        return;
    }
    unmap_locked(r);
    r->atva = 0;
}

static size_t copy_len(const struct region *r)
{
    if (r->vacant)
        return 0;
    if (!r->slab)
        return r->user;
    size_t end = 0;
    for (int i = 0; i < r->nblk; i++)
        if (r->blk[i].used && r->blk[i].off + r->blk[i].size > end)
            end = r->blk[i].off + r->blk[i].size;
    return end;
}

void mm_sync_ctx(CUcontext ctx)
{
    gs_fn_cuCtxPushCurrent_v2 push = REAL(cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = REAL(cuCtxPopCurrent_v2);
    if (push == NULL || pop == NULL || push(ctx) != CUDA_SUCCESS)
        return;
    REAL(cuCtxSynchronize)();
    CUcontext c;
    pop(&c);
}

static void usage_locked(struct gs_usage *u, uint32_t reason)
{
    memset(u, 0, sizeof(*u));
    u->reason = reason;
    u->acks = atomic_load(&MMD->acks);
    /* A report counts the growth the process was granted for and is making (the scheduler keeps
     * reserving it); an eviction answer does not. */
    u->need = atomic_load(&MMD->need_bytes) + (reason == GS_USAGE_REPORT ? atomic_load(&MMD->pending_growth) : 0);
    u->resident = atomic_load(&MMD->resident_bytes);
    u->swapped = atomic_load(&MMD->swapped_bytes);
    u->swap_outs = MMD->swap_outs;
    u->swap_ins = MMD->swap_ins;
    u->bytes_out = MMD->bytes_out;
    u->bytes_in = MMD->bytes_in;
    u->swap_ns = MMD->swap_ns;
}

/* Tells the scheduler what we hold now; lowers our own view of the reservation to match. */
void mm_report_locked(uint32_t reason)
{
    struct gs_usage u;
    usage_locked(&u, reason);
    /* What we keep: what is resident, plus a growth in progress (the report right after the grant
     * for it comes before the allocation; giving that back would let the next waiter take it). */
    uint64_t keep = u.resident;
    if (reason == GS_USAGE_REPORT)
        keep += atomic_load(&MMD->pending_growth);
    if (gs_gate_send(&u, GS_MSG_USAGE, GS_USAGE_SIZE) == 0 && keep < atomic_load(&MMD->reserved))
        atomic_store(&MMD->reserved, keep);
}

void mm_report_slot_locked(int slot, uint32_t reason)
{
    int saved = gs_dev_cur;
    gs_dev_cur = slot;
    mm_report_locked(reason);
    gs_dev_cur = saved;
}

void gs_mm_send_usage(uint32_t reason)
{
    if (!gs_mm_here())
        return;
    pthread_mutex_lock(&mm_mu);
    mm_report_locked(reason);
    pthread_mutex_unlock(&mm_mu);
}

/* ---- swapping ---- */

/* Queues the copy of len bytes between r's pages and its staging on s, one piece per staging
 * registration (a copy across two registrations would go through pageable memory). A piece whose
 * staging the stager has not page-locked yet is waited for: the copy of the previous piece runs
 * meanwhile, and a pageable copy into memory not faulted in yet is several times slower than
 * faulting it in on the stager's threads (mm_stage.c). */
static CUresult copy_async(struct region *r, size_t len, int out, CUstream s)
{
    for (size_t off = 0; off < len; off += STAGE_CHUNK) {
        size_t n = len - off < STAGE_CHUNK ? len - off : STAGE_CHUNK;
        mm_stage_wait_locked(r, off + n);
        CUresult e = out ? REAL(cuMemcpyDtoHAsync_v2)((char *)r->staging + off, r->va + off, n, s)
                         : REAL(cuMemcpyHtoDAsync_v2)(r->va + off, (char *)r->staging + off, n, s);
        if (e != CUDA_SUCCESS)
            return e;
    }
    return CUDA_SUCCESS;
}

/* Waits until every copy queued on the shim's streams is done. */
static void sync_streams_locked(void)
{
    gs_fn_cuCtxPushCurrent_v2 push = REAL(cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = REAL(cuCtxPopCurrent_v2);
    for (int i = 0; i < nstreams; i++) {
        CUcontext c;
        if (push(streams[i].ctx) == CUDA_SUCCESS) {
            REAL(cuStreamSynchronize)(streams[i].s);
            pop(&c);
        }
    }
}

static uint64_t pin_wait_ns_locked(void)
{
    uint64_t pinned, failures, waits, wait_ns;
    mm_stage_stats_locked(&pinned, &failures, &waits, &wait_ns);
    return wait_ns;
}

/* One info line per swap. A swap that waited for the stager says how long: on a host whose memory
 * was never touched (a fresh VM) the kernel faults staging in at 2-4 GB/s, and a swap that comes
 * right after a large allocation waits for that, a cost of the allocation's first touch, not of the
 * copy (shim/bench/oversub.sh reports the rate with and without those swaps). */
static void log_swap(const char *dir, int n, uint64_t bytes, uint64_t dt, uint64_t waited, int raises,
                     uint64_t copying)
{
    char w[224] = "";
    int k = 0;
    if (waited > 0)
        k = snprintf(w, sizeof(w), "; waited %.3f ms for staging to be page-locked", waited / 1e6);
    if (raises > 0 && k >= 0 && (size_t)k < sizeof(w))
        snprintf(w + k, sizeof(w) - (size_t)k,
                 "; overlapped the previous holder's swap out (%d raises), copying for %.3f ms", raises,
                 copying / 1e6);
    gs_log(GS_LOG_INFO, "swap %s: %d allocation(s), %llu bytes in %.3f ms (%.2f GB/s%s)", dir, n,
           (unsigned long long)bytes, dt / 1e6, dt ? (double)bytes / (double)dt : 0.0, w);
}

/* Progress of one eviction across its batches. */
struct swap_out_state {
    uint64_t unreported, step;
    int left; /* regions after the current one */
};

/* Copies up to SWAP_BATCH regions out (one stream per context) and releases their pages. Each
 * region's copy is followed by an event, and its pages go as soon as that event completes, while
 * the copies of the regions after it still run: releasing hundreds of 20 MiB allocations one by one
 * after a single synchronization cost the H100 swap-out ~10-15% of its rate. */
static void swap_out_batch_locked(struct region **list, int n, struct swap_out_state *so)
{
    gs_fn_cuCtxPushCurrent_v2 push = REAL(cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = REAL(cuCtxPopCurrent_v2);
    int ok[SWAP_BATCH];
    CUevent ev[SWAP_BATCH];
    for (int i = 0; i < n; i++) {
        struct region *r = list[i];
        ok[i] = 0;
        ev[i] = NULL;
        CUcontext c;
        if (push(r->ctx) != CUDA_SUCCESS)
            continue;
        if (r->handle) {
            /* The application's handle: copy through our own range, with its mappings gone
             * first (a physical allocation then has one mapping at a time). */
            mm_vmm_detach_locked(r);
            if (map_at_va_locked(r) != CUDA_SUCCESS) {
                mm_vmm_attach_locked(r);
                pop(&c);
                continue;
            }
            r->atva = 1;
        }
        CUstream s = stream_for_locked(r->ctx);
        size_t len = copy_len(r);
        ok[i] = copy_async(r, len, 1, s) == CUDA_SUCCESS;
        if (ok[i] && REAL(cuEventCreate)(&ev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
            REAL(cuEventRecord)(ev[i], s) != CUDA_SUCCESS) {
            REAL(cuEventDestroy_v2)(ev[i]);
            ev[i] = NULL;
        }
        pop(&c);
    }
    int synced = 0;
    for (int i = 0; i < n; i++) {
        struct region *r = list[i];
        so->left--;
        if (ev[i] != NULL) {
            REAL(cuEventSynchronize)(ev[i]);
            REAL(cuEventDestroy_v2)(ev[i]);
        } else if (!synced) {
            sync_streams_locked(); /* no event (or a copy that failed part way): wait for all of them */
            synced = 1;
        }
        if (!ok[i]) {
            gs_log(GS_LOG_WARN, "could not copy out %zu bytes at 0x%llx; they stay resident", r->size,
                   (unsigned long long)r->va);
            if (r->atva) {
                REAL(cuMemUnmap)(r->va, r->size);
                r->atva = 0;
                mm_vmm_attach_locked(r);
            }
            continue;
        }
        unmap_locked(r);
        r->atva = 0;
        atomic_fetch_sub(&mm_devs[r->slot].resident_bytes, r->size);
        atomic_fetch_add(&mm_devs[r->slot].swapped_bytes, r->size);
        mm_devs[r->slot].swap_outs++;
        mm_devs[r->slot].bytes_out += copy_len(r);
        /* The next holder maps and copies in what we release while we copy out the rest (protocol 3:
         * the scheduler raises its reservation by what we report). Not after the last: USAGE(evicted)
         * follows at once. */
        so->unreported += r->size;
        if (so->left > 0 && so->unreported >= so->step) {
            mm_report_locked(GS_USAGE_PROGRESS);
            so->unreported = 0;
        }
    }
}

/* Copies regions out and releases their pages, SWAP_BATCH at a time. */
static void swap_out_locked(struct region **list, int n)
{
    if (n == 0)
        return;
    uint64_t t0 = gs_now_ns(), b0 = MMD->bytes_out, w0 = pin_wait_ns_locked();
    for (int i = 0; i < n; i++) {
        list[i]->urgent = !list[i]->pinned && !list[i]->pin_failed; /* the stager pins these first */
        list[i]->swapping = 1;
    }
    mm_stage_kick_locked();
    struct swap_out_state so = {.left = n};
    for (int i = 0; i < n; i++)
        so.step += list[i]->size;
    so.step = so.step / 8 < PROGRESS_BYTES ? so.step / 8 : PROGRESS_BYTES;
    for (int i = 0; i < n; i += SWAP_BATCH)
        swap_out_batch_locked(list + i, n - i < SWAP_BATCH ? n - i : SWAP_BATCH, &so);
    for (int i = 0; i < n; i++)
        list[i]->swapping = 0;
    mm_stage_kick_locked(); /* wakes frees that waited for this swap */
    uint64_t dt = gs_now_ns() - t0;
    MMD->swap_ns += dt;
    log_swap("out", n, MMD->bytes_out - b0, dt, pin_wait_ns_locked() - w0, 0, dt);
}

/* Swaps out the calling thread's GPU's regions only: its scheduler asked, for its budget. Answered
 * (USAGE) on every GPU that may oversubscribe, whether or not a budget made it active: the single form's
 * one GPU always. */
void gs_mm_evict(uint64_t target)
{
    if (gs_dev_cur == GS_DEV_NONE || (gs_multi && !gs_devs[gs_dev_cur].oversub))
        return;
    mm_flush_deferred();
    pthread_mutex_lock(&mm_mu);
    /* On the heap: a process may have thousands of regions. Without it nothing is evicted (fail open:
     * the scheduler hears USAGE(evicted) with what is still resident). */
    struct region **list = malloc((size_t)(mm_nreg ? mm_nreg : 1) * sizeof(*list));
    int n = 0;
    uint64_t res = atomic_load(&MMD->resident_bytes);
    /* Kept stream-ordered memory first: it goes without a copy. */
    for (int i = 0; list != NULL && res > target && i < mm_nreg; i++) {
        struct region *r = mm_regions[i];
        if (r->slot == gs_dev_cur && r->resident && r->vacant) {
            r->picked = 1;
            list[n++] = r;
            res -= r->size;
        }
    }
    /* Then only what is asked: the smallest region that covers the rest, else the largest, until done. */
    while (list != NULL && res > target) {
        uint64_t rest = res - target;
        struct region *best = NULL, *largest = NULL;
        for (int i = 0; i < mm_nreg; i++) {
            struct region *r = mm_regions[i];
            if (r->slot != gs_dev_cur || !r->resident || r->picked)
                continue;
            if (r->size >= rest && (best == NULL || r->size < best->size))
                best = r;
            if (largest == NULL || r->size > largest->size)
                largest = r;
        }
        struct region *pick = best ? best : largest;
        if (pick == NULL)
            break;
        pick->picked = 1;
        list[n++] = pick;
        res -= pick->size;
    }
    for (int k = 0; k < n; k++)
        list[k]->picked = 0;
    swap_out_locked(list, n);
    free(list);
    gs_log(GS_LOG_DEBUG, "evicted %d allocation(s)%s%s: resident %llu, target %llu", n, gs_multi ? " on " : "",
           gpu_tag(), (unsigned long long)atomic_load(&MMD->resident_bytes), (unsigned long long)target);
    mm_report_locked(GS_USAGE_EVICTED);
    pthread_mutex_unlock(&mm_mu);
}

/* Maps and queues the copy-in of every swapped-out region the reservation has room for (all of them
 * with ignore_budget). Counts what it moved; *missing: regions left out for want of reservation,
 * *failed: regions that could not be mapped or copied. */
static void swap_in_pass_locked(int ignore_budget, int *moved, int *missing, int *failed)
{
    gs_fn_cuCtxPushCurrent_v2 push = REAL(cuCtxPushCurrent_v2);
    gs_fn_cuCtxPopCurrent_v2 pop = REAL(cuCtxPopCurrent_v2);
    *missing = *failed = 0;
    for (int i = 0; i < mm_nreg; i++) {
        struct region *r = mm_regions[i];
        if (r->resident || r->slot != gs_dev_cur)
            continue;
        if (!ignore_budget && atomic_load(&MMD->resident_bytes) + r->size > atomic_load(&MMD->reserved)) {
            (*missing)++;
            continue;
        }
        CUcontext c;
        if (push(r->ctx) != CUDA_SUCCESS) {
            (*failed)++;
            continue;
        }
        CUresult e = map_locked(r);
        if (e == CUDA_SUCCESS) {
            r->atva = r->handle;
            size_t len = copy_len(r);
            if (len > 0)
                e = copy_async(r, len, 0, stream_for_locked(r->ctx));
            atomic_fetch_add(&MMD->resident_bytes, r->size);
            atomic_fetch_sub(&MMD->swapped_bytes, r->size);
            MMD->swap_ins++;
            MMD->bytes_in += len;
            (*moved)++;
        }
        pop(&c);
        if (e != CUDA_SUCCESS) {
            gs_log(GS_LOG_WARN, "swapping in %zu bytes at 0x%llx failed (CUDA error %d)", r->size,
                   (unsigned long long)r->va, e);
            (*failed)++;
        }
    }
}

/* Brings the swapped-out memory back (after a GRANT; ignore_budget: without a scheduler). A grant
 * may come before all we need is free (protocol 3: the previous holder still copies its memory out);
 * then what fits is mapped and copied in at once, and each RAISE of the reservation (read by
 * gs_gate_pump on this same thread) lets in more, so both copy engines run. It returns when
 * everything is in (0), or -1 when something could not come back, or no RAISE came for
 * GPUSHARE_MEMREPLY_TIMEOUT_MS, or the grant ended meanwhile. */
int gs_mm_swap_in_all(int ignore_budget)
{
    if (!gs_mm_here())
        return 0;
    pthread_mutex_lock(&mm_mu);
    uint64_t t0 = gs_now_ns(), b0 = MMD->bytes_in, w0 = pin_wait_ns_locked(), fill_ns = 0, t_first = 0;
    int moved = 0, missing = 0, failed = 0, raises = 0;
    uint64_t last_res = atomic_load(&MMD->reserved), last_ns = t0;
    /* This GPU's list stays as it is while we wait (the stager, a RAISE); another GPU's swaps mark
     * and unmark only their own. */
    for (int i = 0; i < mm_nreg; i++)
        if (mm_regions[i]->slot == gs_dev_cur)
            mm_regions[i]->swapping = 1;
    for (;;) {
        swap_in_pass_locked(ignore_budget, &moved, &missing, &failed);
        if (moved > 0 && t_first == 0)
            t_first = gs_now_ns(); /* a partial grant's copies start here, paced by the other's releases */
        if (missing == 0 || failed > 0 || ignore_budget)
            break;
        /* Missing for want of reservation: a partial grant fills in as the other process's memory
         * leaves. Wait for a RAISE without mm_mu (the stager needs it; frees wait for r->swapping). */
        if (gs_now_ns() - last_ns >= (uint64_t)gs_cfg.memreply_timeout_ms * 1000000ull)
            break;
        pthread_mutex_unlock(&mm_mu);
        uint64_t w = gs_now_ns();
        int alive = gs_gate_pump(5);
        fill_ns += gs_now_ns() - w;
        pthread_mutex_lock(&mm_mu);
        if (atomic_load(&MMD->reserved) != last_res) {
            last_res = atomic_load(&MMD->reserved);
            last_ns = gs_now_ns();
            raises++;
        }
        if (alive != 0)
            break; /* revoked, disconnected or pass-through: what is in stays, the rest comes later */
    }
    if (moved > 0)
        sync_streams_locked();
    /* The application's handles: the pages go from our range to where the application mapped them. */
    for (int i = 0; moved > 0 && mm_handles > 0 && i < mm_nreg; i++) {
        struct region *r = mm_regions[i];
        if (r->slot != gs_dev_cur || !r->handle || !r->resident || !r->atva)
            continue;
        REAL(cuMemUnmap)(r->va, r->size);
        r->atva = 0;
        CUresult e = mm_vmm_attach_locked(r);
        if (e != CUDA_SUCCESS)
            gs_log(GS_LOG_ERROR, "cannot map %zu bytes back where the application mapped them (CUDA error %d)",
                   r->size, e);
    }
    if (moved > 0) {
        uint64_t dt = gs_now_ns() - t0;
        MMD->swap_ns += dt;
        log_swap("in", moved, MMD->bytes_in - b0, dt, pin_wait_ns_locked() - w0, raises, gs_now_ns() - t_first);
        MMD->overlapped += raises > 0;
        if (fill_ns > 0)
            gs_log(GS_LOG_DEBUG, "swap in overlapped the previous holder's swap out: %d raise(s), %.3f ms waiting for them",
                   raises, fill_ns / 1e6);
    }
    for (int i = 0; i < mm_nreg; i++)
        if (mm_regions[i]->slot == gs_dev_cur)
            mm_regions[i]->swapping = 0;
    mm_stage_kick_locked(); /* wakes frees that waited for this swap */
    missing += failed;
    if (moved > 0 || !ignore_budget)
        mm_report_locked(GS_USAGE_REPORT); /* after a grant: "my memory is in", the scheduler starts the quantum */
    pthread_mutex_unlock(&mm_mu);
    return missing ? -1 : 0;
}

/* ---- allocation ---- */


/* Waits for the answer after seq: 0 when it came, -1 after GPUSHARE_MEMREPLY_TIMEOUT_MS. */
static int wait_reply(uint64_t seq)
{
    pthread_once(&rep_once, rep_cv_init);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)gs_cfg.memreply_timeout_ms * 1000000ull;
    dl.tv_sec += (time_t)(ns / 1000000000ull);
    dl.tv_nsec = (long)(ns % 1000000000ull);
    int r = 0;
    pthread_mutex_lock(&MMD->rep_mu);
    while (MMD->rep_seq == seq && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&MMD->rep_cv, &MMD->rep_mu, &dl);
    int got = MMD->rep_seq != seq;
    pthread_mutex_unlock(&MMD->rep_mu);
    return got ? 0 : -1;
}

/* Makes sure `more` bytes beyond the working set fit the reservation; asks the scheduler if not,
 * waiting for its answer with mm_mu released (it may take GPUSHARE_MEMREPLY_TIMEOUT_MS), and then
 * looking at the working set and the reservation again. */
int mm_reserve_locked(uint64_t more)
{
    for (;;) {
        struct mm_dev *m = MMD;
        uint64_t want = atomic_load(&m->need_bytes) + more;
        /* Freed stream-ordered memory we kept is the first to give back (during a capture only what
         * the GPU is done with: waiting for the rest would synchronize). */
        if (want > m->budget && mm_async_drop_locked(!gs_capturing(), want - m->budget) > 0)
            continue;
        if (want > m->budget) {
            gs_log(GS_LOG_WARN,
                   "cuMemAlloc: out of memory: the working set would grow to %llu bytes, more than this "
                   "process's budget of %llu bytes",
                   (unsigned long long)want, (unsigned long long)m->budget);
            atomic_store(&m->pending_growth, 0); /* no growth under way any more */
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (want <= atomic_load(&m->reserved) || !gs_gate_connected())
            return GS_MM_OK;
        if (m->memreq_busy) {
            pthread_cond_wait(&m->memreq_cv, &mm_mu); /* another thread's request: its answer may cover ours */
            continue;
        }
        pthread_mutex_lock(&m->rep_mu);
        uint64_t seq = m->rep_seq;
        pthread_mutex_unlock(&m->rep_mu);
        struct gs_memreq req;
        memset(&req, 0, sizeof(req));
        req.need = want;
        if (gs_gate_send(&req, GS_MSG_MEMREQ, GS_MEMREQ_SIZE) != 0)
            return GS_MM_OK; /* no scheduler any more: pass-through has no budget */
        m->memreq_busy = 1;
        pthread_mutex_unlock(&mm_mu);
        int got = wait_reply(seq);
        pthread_mutex_lock(&mm_mu);
        m->memreq_busy = 0;
        pthread_cond_broadcast(&m->memreq_cv);
        if (got != 0) {
            /* A scheduler that does not answer must not stall the application: give the connection up
             * (the shim reconnects and re-announces) and go on as in pass-through, without a budget. */
            gs_log(GS_LOG_WARN,
                   "no answer to a memory request from the GPU scheduler within %u ms "
                   "(GPUSHARE_MEMREPLY_TIMEOUT_MS): dropping the connection; the allocation goes on without a "
                   "budget until the shim has reconnected",
                   gs_cfg.memreply_timeout_ms);
            gs_gate_drop("no answer to a memory request");
            continue;
        }
        pthread_mutex_lock(&m->rep_mu);
        uint32_t status = m->rep_status;
        pthread_mutex_unlock(&m->rep_mu);
        if (status == GS_MEM_OK || status == UINT32_MAX)
            continue; /* the working set may have changed meanwhile: look again */
        /* The GPU has no more for us now: the freed stream-ordered memory we kept goes before we
         * wait or fail (while the budget has room, it stays, as in a pool that keeps everything). */
        uint64_t res = atomic_load(&m->reserved);
        if (want > res && mm_async_drop_locked(!gs_capturing(), want - res) > 0)
            continue;
        if (status == GS_MEM_TOO_LARGE) {
            gs_log(GS_LOG_WARN,
                   "cuMemAlloc: out of memory: the working set would grow to %llu bytes, which the GPU budget "
                   "of %llu bytes cannot hold now (anti-thrashing mode %u)",
                   (unsigned long long)want, (unsigned long long)m->budget, m->mode);
            atomic_store(&m->pending_growth, 0); /* no growth under way any more */
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (gs_capturing()) {
            /* Growing means giving the GPU back and waiting in line, which needs the process's work
             * drained: impossible while a stream captures (and the capture may be this very thread's). */
            gs_log(GS_LOG_WARN,
                   "cuMemAlloc: out of memory: the working set would grow to %llu bytes, which other processes "
                   "hold now, and this process cannot give the GPU back while a stream captures",
                   (unsigned long long)want);
            atomic_store(&m->pending_growth, 0);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        atomic_store(&m->pending_growth, more);
        return GS_MM_YIELD;
    }
}

/* Frees kept during a capture: once none runs, after waiting for the GPU (cuMemFree semantics), with
 * mm_mu released while waiting. A free the list could not hold stays allocated (fail open). */
void mm_flush_deferred(void)
{
    if (GS_LIKELY(atomic_load_explicit(&ndeferred, memory_order_relaxed) == 0) || gs_capturing())
        return;
    pthread_mutex_lock(&mm_mu);
    int n = ndeferred_locked;
    CUdeviceptr *list = deferred;
    deferred = NULL;
    ndeferred_locked = capdeferred = 0;
    atomic_store(&ndeferred, 0);
    /* The contexts the frees' memory belongs to (with several GPUs, several): each is waited for. */
    CUcontext ctxs[8];
    int nctx = 0, more = 0;
    for (int i = 0; i < n; i++) {
        int k = mm_find_region_locked(list[i]), j;
        if (k < 0)
            continue;
        for (j = 0; j < nctx && ctxs[j] != mm_regions[k]->ctx; j++)
            ;
        if (j == nctx && nctx < 8)
            ctxs[nctx++] = mm_regions[k]->ctx;
        else if (j == nctx)
            more = 1;
    }
    pthread_mutex_unlock(&mm_mu);
    if (n == 0) {
        free(list);
        return;
    }
    gs_ctx_record_current();
    CUcontext only = gs_ctx_only();
    if (only != NULL || more) {
        mm_sync_ctx(only); /* more contexts than remembered: every context the process has (gpu.c) */
        if (only == NULL)
            gs_gpu_drain();
    } else {
        for (int j = 0; j < nctx; j++)
            mm_sync_ctx(ctxs[j]);
    }
    pthread_mutex_lock(&mm_mu);
    for (int i = 0; i < n; i++) {
        CUresult r;
        mm_free_locked(list[i], 0, &r);
    }
    pthread_mutex_unlock(&mm_mu);
    free(list);
}

void mm_free_region_locked(int i)
{
    struct region *r = mm_regions[i];
    mm_stage_wait_busy_locked(r);
    if (r->slab && r->used > 0)
        return; /* a new block was taken from this slab while we waited */
    i = mm_find_region_locked(r->va); /* the array may have moved while we waited */
    struct mm_dev *m = &mm_devs[r->slot];
    if (r->resident) {
        release_pages_locked(r);
        atomic_fetch_sub(&m->resident_bytes, r->size);
    } else {
        atomic_fetch_sub(&m->swapped_bytes, r->size);
    }
    mm_handles -= r->handle;
    atomic_fetch_sub(&m->need_bytes, r->size);
    if (r->span > 0)
        REAL(cuMemAddressFree)(r->va, r->span);
    mm_stage_release_locked(r);
    remove_region_locked(i);
    free(r->blk);
    free(r->maps);
    free(r);
}

/* The reason an allocation fails when the host has no memory to stage it (errno from the mapping). */
static void no_staging(const char *call, size_t size)
{
    gs_log(GS_LOG_WARN,
           "%s: out of memory: cannot allocate %zu bytes of host memory to swap this allocation to (host "
           "memory exhausted: %s)",
           call, size, strerror(errno));
}

/* A region of `size` physical bytes (a multiple of mm_gran) at va, a range already reserved, resident:
 * mapped there for plain memory; for an application handle (prop given) pages only, mapped by the
 * application later. The caller frees the range on failure. */
static CUresult new_region_at_locked(CUdeviceptr va, size_t size, size_t user, int slab,
                                     const CUmemAllocationProp *prop, struct region **out)
{
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    if (REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct region *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r->va = r->base = va;
    r->size = r->span = size;
    r->user = r->base_user = user;
    r->slab = slab;
    r->ctx = ctx;
    r->handle = prop != NULL;
    r->dev = prop ? prop->location.id : dev;
    r->prop = prop ? *prop : prop_for(dev);
    r->id = next_id++;
    r->slot = gs_dev_cur;
    /* Host staging first: reserved with the memory, never in a hand-off; pinned by the stager. */
    r->staging = mm_staging_map(size);
    if (r->staging == MAP_FAILED) {
        no_staging(prop ? "cuMemCreate" : "cuMemAlloc", size);
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult e;
    if (r->handle) {
        e = REAL(cuMemCreate)(&r->h, size, &r->prop, 0);
        r->resident = e == CUDA_SUCCESS;
    } else {
        e = map_locked(r);
    }
    if (e == CUDA_SUCCESS && insert_region_locked(r) != 0) {
        release_pages_locked(r);
        e = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (e != CUDA_SUCCESS) {
        munmap(r->staging, size);
        free(r);
        return e;
    }
    mm_handles += r->handle;
    atomic_fetch_add(&MMD->need_bytes, size);
    atomic_fetch_add(&MMD->resident_bytes, size);
    mm_stage_kick_locked();
    *out = r;
    return CUDA_SUCCESS;
}

CUresult mm_new_region_locked(size_t size, size_t user, int slab, const CUmemAllocationProp *prop,
                              struct region **out)
{
    CUdeviceptr va;
    CUresult e = REAL(cuMemAddressReserve)(&va, size, mm_gran, 0, 0);
    if (e != CUDA_SUCCESS)
        return e;
    e = new_region_at_locked(va, size, user, slab, prop, out);
    if (e != CUDA_SUCCESS)
        REAL(cuMemAddressFree)(va, size);
    return e;
}

/* Frees every segment of the allocation at base, the last first (the first frees the address range). */
static void free_allocation_locked(CUdeviceptr base)
{
    for (;;) {
        int i = mm_find_region_locked(base), last = i;
        if (i < 0)
            return;
        while (last + 1 < mm_nreg && mm_regions[last + 1]->base == base && mm_regions[last + 1]->va != base)
            last++;
        mm_free_region_locked(last);
        if (last == i)
            return;
    }
}

/* A large cuMemAlloc as segments of gs_cfg.segment_bytes on one address range, each its own physical
 * allocation, staging and residency: an eviction then takes only the segments the next holder needs
 * (a 5.75 GiB PyTorch ballast left whole when 4.4 GB would do), and the next grant brings back only
 * the missing ones. Pointers and the answers about the allocation stay those of one allocation. */
static CUresult new_split_locked(size_t size, size_t user, size_t seg, CUdeviceptr *dptr)
{
    if (!mm_staging_fits(size)) {
        no_staging("cuMemAlloc", size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUdeviceptr va;
    CUresult e = REAL(cuMemAddressReserve)(&va, size, mm_gran, 0, 0);
    if (e != CUDA_SUCCESS)
        return e;
    uint64_t id = next_id;
    for (size_t off = 0; off < size; off += seg) {
        size_t n = size - off < seg ? size - off : seg;
        struct region *r;
        e = new_region_at_locked(va + off, n, user > off ? (user - off < n ? user - off : n) : 0, 0, NULL, &r);
        if (e != CUDA_SUCCESS) {
            if (off == 0)
                REAL(cuMemAddressFree)(va, size);
            else
                free_allocation_locked(va);
            return e;
        }
        r->base = va;
        r->base_user = user;
        r->span = off == 0 ? size : 0;
        r->id = id;
    }
    *dptr = va;
    return CUDA_SUCCESS;
}

void mm_learn_granularity_locked(void)
{
    if (mm_gran != 0)
        return;
    CUdevice dev = 0;
    REAL(cuCtxGetDevice)(&dev);
    CUmemAllocationProp p = prop_for(dev);
    if (REAL(cuMemGetAllocationGranularity)(&mm_gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        mm_gran == 0)
        mm_gran = 2u << 20;
}

/* First fit in a slab of the current context; splits the free block. */
static int slab_take_locked(struct region *r, size_t sz, size_t user, CUdeviceptr *dptr)
{
    for (int i = 0; i < r->nblk; i++) {
        struct block *b = &r->blk[i];
        if (b->used || b->size < sz)
            continue;
        if (b->size > sz) {
            if (r->nblk == r->capblk) {
                int cap = r->capblk ? r->capblk * 2 : 16;
                struct block *nb = realloc(r->blk, (size_t)cap * sizeof(*nb));
                if (nb == NULL)
                    return -1;
                r->blk = nb;
                r->capblk = cap;
                b = &r->blk[i];
            }
            memmove(&r->blk[i + 2], &r->blk[i + 1], (size_t)(r->nblk - i - 1) * sizeof(*b));
            r->blk[i + 1] = (struct block){.off = b->off + sz, .size = b->size - sz};
            r->nblk++;
            b->size = sz;
        }
        b->used = 1;
        b->user = user;
        b->id = next_id++;
        r->used++;
        *dptr = r->va + b->off;
        return 0;
    }
    return -1;
}

CUresult gs_mm_alloc(CUdeviceptr *dptr, size_t n, int split, int *yield)
{
    *yield = 0;
    if (dptr == NULL || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    mm_flush_deferred();
    uint64_t t0 = gs_now_ns();
    pthread_mutex_lock(&mm_mu);
    mm_learn_granularity_locked();
    int small = n <= mm_gran / 4;
    size_t phys = small ? mm_gran : round_up(n, mm_gran);
    if (mm_exceeds_budget("cuMemAlloc", phys)) {
        pthread_mutex_unlock(&mm_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult e;
    if (small) {
        size_t sz = round_up(n, SLAB_ALIGN);
        CUcontext ctx = NULL;
        REAL(cuCtxGetCurrent)(&ctx);
        for (int i = 0; i < mm_nreg; i++) {
            struct region *r = mm_regions[i];
            if (r->slab && r->ctx == ctx && r->slot == gs_dev_cur && slab_take_locked(r, sz, n, dptr) == 0) {
                pthread_mutex_unlock(&mm_mu);
                return CUDA_SUCCESS;
            }
        }
        int rr = mm_reserve_locked(phys);
        if (rr != GS_MM_OK) {
            pthread_mutex_unlock(&mm_mu);
            *yield = rr == GS_MM_YIELD;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        struct region *r;
        e = mm_new_region_locked(phys, 0, 1, NULL, &r);
        if (e == CUDA_SUCCESS) {
            r->blk = calloc(16, sizeof(*r->blk));
            r->capblk = 16;
            r->nblk = 1;
            r->blk[0] = (struct block){.off = 0, .size = phys};
            if (r->blk == NULL || slab_take_locked(r, sz, n, dptr) != 0) {
                mm_free_region_locked(mm_find_region_locked(r->va));
                e = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    } else {
        int rr = mm_reserve_locked(phys);
        if (rr != GS_MM_OK) {
            pthread_mutex_unlock(&mm_mu);
            *yield = rr == GS_MM_YIELD;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        size_t seg = round_up(gs_cfg.segment_bytes, mm_gran);
        struct region *r;
        if (split && seg > 0 && phys > seg) {
            e = new_split_locked(phys, n, seg, dptr);
        } else {
            e = mm_new_region_locked(phys, n, 0, NULL, &r);
            if (e == CUDA_SUCCESS)
                *dptr = r->va;
        }
    }
    mm_allocated_locked(t0);
    pthread_mutex_unlock(&mm_mu);
    return e;
}

void mm_allocated_locked(uint64_t t0)
{
    atomic_store(&MMD->pending_growth, 0);
    /* New pages (or a reservation raised for nothing): keep the scheduler's view current. */
    mm_report_locked(GS_USAGE_REPORT);
    MMD->alloc_ns += gs_now_ns() - t0;
    MMD->allocs++;
}

/* An allocation of n bytes on its own: more than the whole budget fails at once, with a reason. */
uint64_t mm_need_locked(void)
{
    return atomic_load(&MMD->need_bytes);
}

int mm_exceeds_budget(const char *call, size_t n)
{
    if (n <= MMD->budget)
        return 0;
    gs_log(GS_LOG_WARN, "%s: out of memory: %zu bytes is more than this GPU's whole budget of %llu bytes", call, n,
           (unsigned long long)MMD->budget);
    return 1;
}

int mm_free_locked(CUdeviceptr d, int sync, CUresult *res)
{
    int i = mm_find_region_locked(d);
    if (i < 0 || mm_regions[i]->handle)
        return GS_MM_NOT_OURS;
    struct region *r = mm_regions[i];
    int slot = r->slot; /* the GPU whose scheduler hears of the free, whichever thread frees */
    *res = CUDA_SUCCESS;
    if (!r->slab) {
        if (d != r->base) {
            *res = CUDA_ERROR_INVALID_VALUE;
            return GS_MM_OK;
        }
        if (sync)
            mm_sync_ctx(r->ctx); /* like cuMemFree: the memory is not in use when it goes */
        free_allocation_locked(d);
        mm_report_slot_locked(slot, GS_USAGE_REPORT);
        return GS_MM_OK;
    }
    int k;
    for (k = 0; k < r->nblk; k++)
        if (r->blk[k].used && r->va + r->blk[k].off == d)
            break;
    if (k == r->nblk) {
        *res = CUDA_ERROR_INVALID_VALUE;
        return GS_MM_OK;
    }
    if (sync)
        mm_sync_ctx(r->ctx);
    r->blk[k].used = 0;
    r->used--;
    /* coalesce with free neighbours */
    if (k + 1 < r->nblk && !r->blk[k + 1].used) {
        r->blk[k].size += r->blk[k + 1].size;
        memmove(&r->blk[k + 1], &r->blk[k + 2], (size_t)(r->nblk - k - 2) * sizeof(*r->blk));
        r->nblk--;
    }
    if (k > 0 && !r->blk[k - 1].used) {
        r->blk[k - 1].size += r->blk[k].size;
        memmove(&r->blk[k], &r->blk[k + 1], (size_t)(r->nblk - k - 1) * sizeof(*r->blk));
        r->nblk--;
    }
    if (r->used == 0) {
        mm_free_region_locked(i);
        mm_report_slot_locked(slot, GS_USAGE_REPORT);
    }
    return GS_MM_OK;
}

/* cuMemFree of swappable memory: like the driver, it waits for the context's work first, with
 * mm_mu released; during a capture that wait is not allowed, so the free is kept until it ended. */
int gs_mm_free(CUdeviceptr d, CUresult *res)
{
    mm_flush_deferred();
    pthread_mutex_lock(&mm_mu);
    if (mm_async_cached_locked(d)) {
        *res = CUDA_ERROR_INVALID_VALUE; /* already freed by cuMemFreeAsync */
        pthread_mutex_unlock(&mm_mu);
        return GS_MM_OK;
    }
    int i = mm_find_region_locked(d);
    if (i < 0 || mm_regions[i]->handle) {
        pthread_mutex_unlock(&mm_mu);
        return GS_MM_NOT_OURS;
    }
    CUcontext ctx = mm_regions[i]->ctx;
    if (gs_capturing()) {
        *res = CUDA_SUCCESS;
        if (ndeferred_locked == capdeferred) {
            int cap = capdeferred ? capdeferred * 2 : 16;
            CUdeviceptr *n = realloc(deferred, (size_t)cap * sizeof(*n));
            if (n == NULL) {
                pthread_mutex_unlock(&mm_mu);
                gs_log(GS_LOG_WARN, "cuMemFree(0x%llx) during a stream capture: cannot remember it; the memory "
                                    "stays allocated", (unsigned long long)d);
                return GS_MM_OK;
            }
            deferred = n;
            capdeferred = cap;
        }
        deferred[ndeferred_locked++] = d;
        atomic_store(&ndeferred, ndeferred_locked);
        pthread_mutex_unlock(&mm_mu);
        return GS_MM_OK;
    }
    pthread_mutex_unlock(&mm_mu);
    mm_sync_ctx(ctx); /* like cuMemFree: the memory is not in use when it goes */
    pthread_mutex_lock(&mm_mu);
    int r = mm_free_locked(d, 0, res); /* looked up again: the regions may have changed meanwhile */
    pthread_mutex_unlock(&mm_mu);
    return r;
}

/* ---- what the driver would say about a plain allocation ---- */


int gs_mm_lookup(CUdeviceptr p, struct gs_mm_info *out)
{
    if (__atomic_load_n(&mm_nreg, __ATOMIC_RELAXED) == 0)
        return 0;
    pthread_mutex_lock(&mm_mu);
    int i = mm_find_region_locked(p);
    int found = 0;
    if (i >= 0 && !mm_regions[i]->handle) {
        struct region *r = mm_regions[i];
        out->slot = r->slot;
        out->ctx = r->ctx;
        out->dev = r->dev;
        out->resident = r->resident;
        if (!r->slab) {
            if (p < r->base + r->base_user) {
                out->base = r->base;
                out->size = r->base_user;
                out->id = r->id;
                found = 1;
            }
        } else {
            for (int k = 0; k < r->nblk; k++) {
                struct block *b = &r->blk[k];
                if (b->used && p >= r->va + b->off && p < r->va + b->off + b->user) {
                    out->base = r->va + b->off;
                    out->size = b->user;
                    out->id = b->id;
                    found = 1;
                    break;
                }
            }
        }
    }
    pthread_mutex_unlock(&mm_mu);
    return found;
}

int gs_mm_budget(uint64_t *total, uint64_t *used)
{
    if (MMD->state != MM_ACTIVE)
        return 0;
    *total = MMD->budget;
    *used = atomic_load(&MMD->need_bytes);
    return 1;
}

void gs_mm_atfork_child(void)
{
    /* CUDA does not survive fork: the child starts without swappable memory. */
    pthread_mutex_init(&mm_mu, NULL);
    for (int i = 0; i < GS_DEV_SLOTS; i++) {
        struct mm_dev *m = &mm_devs[i];
        memset(m, 0, sizeof(*m));
        pthread_mutex_init(&m->rep_mu, NULL);
        pthread_cond_init(&m->memreq_cv, NULL);
        atomic_store(&gs_mm_on[i], 0);
    }
    deferred = NULL;
    ndeferred_locked = capdeferred = 0;
    atomic_store(&ndeferred, 0);
    rep_cv_init();
    mm_stage_atfork_child();
    mm_nreg = 0;
    mm_handles = 0;
    nstreams = 0;
    mm_async_atfork_child();
}

/* At exit, at info level: what swapping cost this process. */
void gs_mm_log_stats(void)
{
    if (MMD->state != MM_ACTIVE)
        return;
    pthread_mutex_lock(&mm_mu);
    uint64_t reused, fresh, passed, pinned, pin_failures, pin_waits, pin_wait_ns;
    mm_async_stats_locked(&reused, &fresh, &passed);
    mm_stage_stats_locked(&pinned, &pin_failures, &pin_waits, &pin_wait_ns);
    gs_log(GS_LOG_INFO,
           "swap stats%s%s: out=%llu (%llu bytes) in=%llu (%llu bytes) overlapped=%llu time=%.3f s resident=%llu "
           "swapped=%llu; "
           "new allocations=%llu in %.3f s, staging pinned=%llu bytes, pin failures=%llu, pin_waits=%llu "
           "(%.3f s); stream-ordered allocations async_new=%llu async_reused=%llu async_passed=%llu",
           gs_multi ? " " : "", gpu_tag(), (unsigned long long)MMD->swap_outs, (unsigned long long)MMD->bytes_out,
           (unsigned long long)MMD->swap_ins, (unsigned long long)MMD->bytes_in, (unsigned long long)MMD->overlapped,
           MMD->swap_ns / 1e9, (unsigned long long)atomic_load(&MMD->resident_bytes),
           (unsigned long long)atomic_load(&MMD->swapped_bytes), (unsigned long long)MMD->allocs, MMD->alloc_ns / 1e9,
           (unsigned long long)pinned, (unsigned long long)pin_failures, (unsigned long long)pin_waits,
           pin_wait_ns / 1e9, (unsigned long long)fresh, (unsigned long long)reused, (unsigned long long)passed);
    pthread_mutex_unlock(&mm_mu);
}
