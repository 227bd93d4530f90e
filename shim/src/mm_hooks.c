/*
 * The memory entry points of hooks.def class MM. Allocation and free wait for
 * the lock like any WORK call; with oversubscription on they go to the
 * memory manager (mm.c). The queries answer for swappable memory as the
 * driver would for a plain cuMemAlloc allocation: the range is the user's
 * allocation (not the 2 MiB reservation or the slab), the context is the one
 * that allocated it, the buffer id does not change when the pages do, and
 * cuMemGetInfo reports the budget as the total. Under a memory limit (cap.c)
 * every allocation is charged to it first and cuMemGetInfo reports the
 * limit. Anything else goes to the driver untouched.
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"


#define REAL_OR_FAIL(name)                                                                         \
    gs_fn_##name real = (gs_fn_##name)gs_real(GS_ID_##name);                                       \
    if (GS_UNLIKELY(real == NULL))                                                                 \
        return CUDA_ERROR_NOT_INITIALIZED;

static CUresult alloc_v2(gs_fn_cuMemAlloc_v2 real, CUdeviceptr *dptr, size_t n)
{
    for (;;) {
        int gd = gs_gate_enter(GS_ID_cuMemAlloc_v2);
        if (!gs_mm_here()) {
            CUresult r = real(dptr, n);
            gs_gate_leave(gd);
            return r;
        }
        int yield;
        CUresult r = gs_mm_alloc(dptr, n, 1, &yield);
        gs_gate_leave(gd);
        if (!yield)
            return r;
        gs_gate_yield(); /* others hold the memory: give the GPU back, wait in line with the larger need */
    }
}

/* The memory limit (cap.c) is charged first, so that memory past it is never taken from the GPU,
 * not even for a moment; calls the driver refuses anyway (no pointer, no bytes) are left to it. It is
 * charged what the driver takes: above half a granule (1 MiB), whole granules (gs_cap_size). */
GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMemAlloc_v2)
    if (GS_LIKELY(!gs_cap_on()) || dptr == NULL || n == 0)
        return alloc_v2(real, dptr, n);
    uint64_t c = gs_cap_size(n);
    CUresult r = gs_cap_charge(c);
    if (r != CUDA_SUCCESS)
        return r;
    r = alloc_v2(real, dptr, n);
    gs_cap_done(r, GS_CAP_PTR, r == CUDA_SUCCESS ? *dptr : 0, c);
    return r;
}

static CUresult free_v2(gs_fn_cuMemFree_v2 real, CUdeviceptr d)
{
    int gd = gs_gate_enter(GS_ID_cuMemFree_v2);
    CUresult r;
    if (!gs_mm_here() || gs_mm_free(d, &r) == GS_MM_NOT_OURS)
        r = real(d);
    gs_gate_leave(gd);
    return r;
}

static CUresult pitch_v2(gs_fn_cuMemAllocPitch_v2 real, CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                         unsigned int elem)
{
    if (!gs_mm_here()) {
        int gd = gs_gate_enter(GS_ID_cuMemAllocPitch_v2);
        int on = gs_mm_here();
        if (!on) {
            CUresult r = real(dptr, pitch, w, h, elem);
            gs_gate_leave(gd);
            return r;
        }
        gs_gate_leave(gd);
    }
    if (pitch == NULL || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (w + 511) / 512 * 512; /* the texture pitch alignment of current GPUs */
    gs_fn_cuMemAlloc_v2 alloc = (gs_fn_cuMemAlloc_v2)gs_real(GS_ID_cuMemAlloc_v2);
    if (alloc == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = alloc_v2(alloc, dptr, p * h);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

/* The limit counts pitch * height, what the driver really takes (in whole granules above half a granule): w * h
 * is charged first (the pitch is never less), the padding once the driver has said what the pitch is. */
GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMemAllocPitch_v2)
    if (GS_LIKELY(!gs_cap_on()) || dptr == NULL || pitch == NULL || w == 0 || h == 0)
        return pitch_v2(real, dptr, pitch, w, h, elem);
    if (w > SIZE_MAX / h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t first = gs_cap_size((uint64_t)w * h);
    CUresult r = gs_cap_charge(first);
    if (r != CUDA_SUCCESS)
        return r;
    r = pitch_v2(real, dptr, pitch, w, h, elem);
    if (r != CUDA_SUCCESS) {
        gs_cap_uncharge(first);
        return r;
    }
    uint64_t all = *pitch > w && *pitch <= UINT64_MAX / h ? gs_cap_size((uint64_t)*pitch * h) : first;
    uint64_t pad = all > first ? all - first : 0;
    if (pad != 0 && gs_cap_charge(pad) != CUDA_SUCCESS) {
        gs_fn_cuMemFree_v2 fr = (gs_fn_cuMemFree_v2)gs_real(GS_ID_cuMemFree_v2);
        if (fr != NULL)
            free_v2(fr, *dptr);
        gs_cap_uncharge(first);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gs_cap_track(GS_CAP_PTR, *dptr, first + pad);
    return CUDA_SUCCESS;
}

/* Managed memory is never swapped by the shim (the driver migrates it), but it counts in the limit:
 * it can all be on the GPU at once, in the same granules as cuMemAlloc's. */
GS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMemAllocManaged)
    int cap = gs_cap_on() && dptr != NULL && n != 0;
    uint64_t c = cap ? gs_cap_size(n) : 0;
    if (cap) {
        CUresult r = gs_cap_charge(c);
        if (r != CUDA_SUCCESS)
            return r;
    }
    int gd = gs_gate_enter(GS_ID_cuMemAllocManaged);
    CUresult r = real(dptr, n, flags);
    gs_gate_leave(gd);
    if (cap)
        gs_cap_done(r, GS_CAP_PTR, r == CUDA_SUCCESS ? *dptr : 0, c);
    return r;
}

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr d)
{
    gs_dev_pick_ptr(d);
    REAL_OR_FAIL(cuMemFree_v2)
    if (GS_LIKELY(!gs_cap_on()))
        return free_v2(real, d);
    struct gs_cap_free f;
    gs_cap_free_begin(GS_CAP_PTR, d, &f);
    CUresult r = free_v2(real, d);
    gs_cap_free_end(&f, r);
    return r;
}

/*
 * With oversubscription the budget stands for the driver: the process's working set never passes it
 * (others are swapped out to make room), so the total is the budget and the free memory what the
 * working set leaves. A memory limit lowers both: the total is the limit (never more than the GPU's
 * memory or the budget), the free memory what the limit leaves (never more than there is).
 */
GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMemGetInfo_v2)
    uint64_t b, used;
    int mm = gs_mm_budget(&b, &used);
    if (!mm && !gs_cap_on())
        return real(free, total);
    if (free == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t t, f;
    if (mm) {
        t = b;
        f = used < b ? b - used : 0;
        if (gs_cap_on())
            gs_cap_report(b, f, &t, &f);
    } else {
        size_t rf = 0, rt = 0;
        CUresult r = real(&rf, &rt);
        if (r != CUDA_SUCCESS)
            return r;
        gs_cap_report(rt, rf, &t, &f);
    }
    *total = (size_t)t;
    *free = (size_t)f;
    return CUDA_SUCCESS;
}

/* Our answer for one attribute of swappable memory; 1 if answered, 0 to ask the driver. */
static int attribute(void *data, CUpointer_attribute a, CUdeviceptr p, const struct gs_mm_info *in)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = in->ctx;
        return 1;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = in->base;
        return 1;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = in->size;
        return 1;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = in->id;
        return 1;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(unsigned char *)data = 1; /* like cuMemAlloc memory: synchronous copies are synchronous */
        return 1;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(unsigned char *)data = 0;
        return 1;
    }
    if (in->resident)
        return 0;
    /* Swapped out: the driver no longer knows the range; answer the common ones ourselves. */
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return 1;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p;
        return 1;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = in->dev;
        return 1;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned char *)data = 0;
        return 1;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned char *)data = 1; /* mapped again before the application's next GPU call */
        return 1;
    }
    return 0;
}

/* The application's own mappings (mm_vmm.c) are the driver's to describe, once they are back. */
#define GATED_IF_VMM(id, p, call)                                                                  \
    if (gs_mm_vmm_mapped(p)) {                                                                     \
        int gd = gs_gate_enter(id);                                                                         \
        CUresult r_ = call;                                                                        \
        gs_gate_leave(gd);                                                                           \
        return r_;                                                                                 \
    }                                                                                              \
    return call;

GS_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    gs_dev_pick_ptr(p);
    REAL_OR_FAIL(cuPointerGetAttribute)
    struct gs_mm_info in;
    if (data != NULL && gs_mm_here() && gs_mm_lookup(p, &in) &&
        attribute(data, a, p, &in))
        return CUDA_SUCCESS;
    GATED_IF_VMM(GS_ID_cuPointerGetAttribute, p, real(data, a, p))
}

GS_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
    gs_dev_pick_ptr(p);
    REAL_OR_FAIL(cuPointerGetAttributes)
    struct gs_mm_info in;
    if (attrs == NULL || data == NULL || !gs_mm_here() ||
        !gs_mm_lookup(p, &in)) {
        GATED_IF_VMM(GS_ID_cuPointerGetAttributes, p, real(n, attrs, data, p))
    }
    CUresult r = CUDA_SUCCESS;
    if (in.resident)
        r = real(n, attrs, data, p); /* then overwrite what the driver says differently for VMM memory */
    for (unsigned int i = 0; i < n; i++)
        if (data[i] != NULL)
            attribute(data[i], attrs[i], p, &in);
    return in.resident ? r : CUDA_SUCCESS;
}

GS_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr d)
{
    gs_dev_pick_ptr(d);
    REAL_OR_FAIL(cuMemGetAddressRange_v2)
    struct gs_mm_info in;
    if (!gs_mm_here() || !gs_mm_lookup(d, &in)) {
        GATED_IF_VMM(GS_ID_cuMemGetAddressRange_v2, d, real(pbase, psize, d))
    }
    if (pbase)
        *pbase = in.base;
    if (psize)
        *psize = in.size;
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr d)
{
    gs_dev_pick_ptr(d);
    REAL_OR_FAIL(cuIpcGetMemHandle)
    struct gs_mm_info in;
    if (!gs_mm_here() || !gs_mm_lookup(d, &in))
        return real(handle, d);
    static atomic_int warned;
    gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
           "cuIpcGetMemHandle(0x%llx): not supported on swappable memory (legacy CUDA IPC needs memory that "
           "never leaves the GPU; e.g. torch.multiprocessing sharing CUDA tensors). Run this process with "
           "GPUSHARE_OVERSUB=0 to share it",
           (unsigned long long)d);
    return CUDA_ERROR_NOT_SUPPORTED;
}
