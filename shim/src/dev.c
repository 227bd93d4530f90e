/*
 * Which shared GPU a call works on (the list form of the environment, docs/multigpu.md).
 *
 * Every per-GPU part of the shim (the gate, the memory limit and the claim's ledger, the memory
 * manager) keeps its state per GPU and reads the one of gs_dev_cur, the calling thread's GPU: a hook
 * picks it at its entry from the call's context (the current one, a stream's, or the device of the
 * pointer it frees), a thread of the shim's that serves one GPU sets it once. The single form has one
 * GPU, slot 0, and never looks: gs_dev_pick is then one load and a branch.
 *
 * A context maps to its ordinal once (the hooks see each context made, with its ordinal; one made
 * elsewhere is asked of the driver the first time), an ordinal to its slot once (cuDeviceGetUuid_v2,
 * compared with the listed UUIDs). A GPU not in the list is GS_DEV_NONE: its calls pass through.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

struct gs_dev gs_devs[GS_DEV_SLOTS];
int gs_ndevs;
int gs_multi;
__thread int gs_dev_cur;

#define MAX_ORDINALS 64
#define MAX_CTXS 64

/* ordinal -> slot + 1 (0: not looked up yet) */
static atomic_int ord_slot[MAX_ORDINALS];
/* context -> ordinal, filled once per context; a slot's ordinal is written before its context is published */
static _Atomic(uintptr_t) ctx_key[MAX_CTXS];
static atomic_int ctx_ord[MAX_CTXS];

int gs_dev_of_uuid(const char *uuid)
{
    for (int i = 0; i < gs_ndevs; i++)
        if (strcmp(gs_devs[i].uuid, uuid) == 0)
            return i;
    return GS_DEV_NONE;
}

int gs_dev_slot_of_ordinal(CUdevice ord)
{
    if (ord < 0 || ord >= MAX_ORDINALS)
        return GS_DEV_NONE;
    int s = atomic_load_explicit(&ord_slot[ord], memory_order_acquire);
    if (GS_LIKELY(s != 0))
        return s - 1;
    gs_fn_cuDeviceGetUuid_v2 get = (gs_fn_cuDeviceGetUuid_v2)gs_real(GS_ID_cuDeviceGetUuid_v2);
    CUuuid u;
    int slot = GS_DEV_NONE;
    if (get != NULL && get(&u, ord) == CUDA_SUCCESS) {
        const unsigned char *b = (const unsigned char *)u.bytes;
        char s36[64];
        snprintf(s36, sizeof(s36),
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        slot = gs_dev_of_uuid(s36);
        gs_log(GS_LOG_INFO, "CUDA device %d is %s: %s", ord, s36,
               slot == GS_DEV_NONE ? "not shared (not in GPUSHARE_GPU_UUID), its calls pass through" : "shared");
    } else {
        gs_log(GS_LOG_WARN, "cannot read the UUID of CUDA device %d: its calls pass through", ord);
    }
    atomic_store_explicit(&ord_slot[ord], slot + 1, memory_order_release);
    return slot;
}

void gs_dev_ctx_seen(CUcontext ctx, CUdevice dev)
{
    if (!gs_multi || ctx == NULL)
        return;
    for (int i = 0; i < MAX_CTXS; i++) {
        uintptr_t k = atomic_load_explicit(&ctx_key[i], memory_order_acquire);
        if (k == (uintptr_t)ctx)
            return;
        if (k != 0)
            continue;
        atomic_store_explicit(&ctx_ord[i], dev, memory_order_relaxed);
        uintptr_t empty = 0;
        if (atomic_compare_exchange_strong(&ctx_key[i], &empty, (uintptr_t)ctx))
            return;
        if (empty == (uintptr_t)ctx)
            return;
    }
    /* full: such a context is asked of the driver at each pick */
}

/* The ordinal of ctx (-1: none): remembered, else asked with the context made current for a moment. */
static CUdevice ordinal_of(CUcontext ctx, int current)
{
    for (int i = 0; i < MAX_CTXS; i++) {
        uintptr_t k = atomic_load_explicit(&ctx_key[i], memory_order_acquire);
        if (k == 0)
            break;
        if (k == (uintptr_t)ctx)
            return atomic_load_explicit(&ctx_ord[i], memory_order_relaxed);
    }
    gs_fn_cuCtxGetDevice getdev = (gs_fn_cuCtxGetDevice)gs_real(GS_ID_cuCtxGetDevice);
    CUdevice d = -1;
    if (getdev == NULL)
        return -1;
    if (current) {
        if (getdev(&d) != CUDA_SUCCESS)
            return -1;
    } else {
        gs_fn_cuCtxPushCurrent_v2 push = (gs_fn_cuCtxPushCurrent_v2)gs_real(GS_ID_cuCtxPushCurrent_v2);
        gs_fn_cuCtxPopCurrent_v2 pop = (gs_fn_cuCtxPopCurrent_v2)gs_real(GS_ID_cuCtxPopCurrent_v2);
        if (push == NULL || pop == NULL || push(ctx) != CUDA_SUCCESS)
            return -1;
        CUresult r = getdev(&d);
        CUcontext dummy;
        pop(&dummy);
        if (r != CUDA_SUCCESS)
            return -1;
    }
    gs_dev_ctx_seen(ctx, d);
    return d;
}

int gs_dev_pick_ctx_slow(CUcontext ctx)
{
    int current = ctx == NULL;
    if (current) {
        gs_fn_cuCtxGetCurrent get = (gs_fn_cuCtxGetCurrent)gs_real(GS_ID_cuCtxGetCurrent);
        if (get == NULL || get(&ctx) != CUDA_SUCCESS || ctx == NULL)
            return GS_DEV_NONE; /* no context: the driver refuses the call anyway */
    }
    return gs_dev_slot_of_ordinal(ordinal_of(ctx, current));
}

int gs_dev_pick_stream_slow(CUstream s)
{
    /* The legacy and per-thread streams are the current context's. */
    if (s == NULL || s == (CUstream)0x1 || s == CU_STREAM_PER_THREAD)
        return gs_dev_pick_ctx_slow(NULL);
    gs_fn_cuStreamGetCtx get = (gs_fn_cuStreamGetCtx)gs_real(GS_ID_cuStreamGetCtx);
    CUcontext ctx = NULL;
    if (get == NULL || get(s, &ctx) != CUDA_SUCCESS || ctx == NULL)
        return gs_dev_pick_ctx_slow(NULL);
    gs_fn_cuCtxGetCurrent cur = (gs_fn_cuCtxGetCurrent)gs_real(GS_ID_cuCtxGetCurrent);
    CUcontext c = NULL;
    int current = cur != NULL && cur(&c) == CUDA_SUCCESS && c == ctx;
    return gs_dev_slot_of_ordinal(ordinal_of(ctx, current));
}

int gs_dev_pick_ptr_slow(CUdeviceptr p)
{
    int d = gs_cap_any ? gs_cap_owner(GS_CAP_PTR, p) : GS_DEV_NONE;
    if (d != GS_DEV_NONE)
        return d;
    struct gs_mm_info in;
    if (gs_mm_lookup(p, &in))
        return in.slot;
    return gs_dev_pick_ctx_slow(NULL);
}

int gs_dev_slot_of_ctx(CUcontext ctx)
{
    return gs_dev_slot_of_ordinal(ordinal_of(ctx, 0));
}

int gs_dev_pick_handle_slow(uint64_t h)
{
    int d = gs_cap_any ? gs_cap_owner(GS_CAP_HANDLE, h) : GS_DEV_NONE;
    if (d == GS_DEV_NONE)
        d = gs_mm_handle_slot(h);
    return d != GS_DEV_NONE ? d : gs_dev_pick_ctx_slow(NULL);
}

/* The device of the physical allocation mapped at p, asked of the driver (-1: none known). */
static CUdevice device_mapped_at(CUdeviceptr p)
{
    gs_fn_cuMemRetainAllocationHandle retain =
        (gs_fn_cuMemRetainAllocationHandle)gs_real(GS_ID_cuMemRetainAllocationHandle);
    gs_fn_cuMemGetAllocationPropertiesFromHandle props =
        (gs_fn_cuMemGetAllocationPropertiesFromHandle)gs_real(GS_ID_cuMemGetAllocationPropertiesFromHandle);
    gs_fn_cuMemRelease release = (gs_fn_cuMemRelease)gs_real(GS_ID_cuMemRelease);
    CUmemGenericAllocationHandle h;
    if (retain == NULL || props == NULL || release == NULL || retain(&h, (void *)(uintptr_t)p) != CUDA_SUCCESS)
        return -1;
    CUmemAllocationProp pr;
    CUresult r = props(&pr, h);
    release(h);
    return r == CUDA_SUCCESS && pr.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? pr.location.id : -1;
}

int gs_dev_pick_va_slow(CUdeviceptr p)
{
    int d = gs_cap_any ? gs_cap_owner(GS_CAP_MAP, p) : GS_DEV_NONE;
    if (d == GS_DEV_NONE)
        d = gs_mm_va_slot(p);
    if (d != GS_DEV_NONE)
        return d;
    CUdevice dev = device_mapped_at(p);
    return dev >= 0 ? gs_dev_slot_of_ordinal(dev) : gs_dev_pick_ctx_slow(NULL);
}
