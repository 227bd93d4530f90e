/*
 * The memory entry points of hooks.def class MM. Allocation and free wait for
 * the lock like any WORK call; with oversubscription on they go to the
 * memory manager (mm.c). The queries answer for swappable memory as the
 * driver would for a plain cuMemAlloc allocation: the range is the user's
 * allocation (not the 2 MiB reservation or the slab), the context is the one
 * that allocated it, the buffer id does not change when the pages do, and
 * cuMemGetInfo reports the budget as the total. Anything else goes to the
 * driver untouched.
 */
#include <string.h>

#include "internal.h"


#define REAL_OR_FAIL(name)                                                                         \
    gs_fn_##name real = (gs_fn_##name)gs_real(GS_ID_##name);                                       \
    if (GS_UNLIKELY(real == NULL))                                                                 \
        return CUDA_ERROR_NOT_INITIALIZED;

GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n)
{
    REAL_OR_FAIL(cuMemAlloc_v2)
    for (;;) {
        gs_gate_enter(GS_ID_cuMemAlloc_v2);
        if (!atomic_load_explicit(&gs_mm_on, memory_order_relaxed)) {
            CUresult r = real(dptr, n);
            gs_gate_leave();
            return r;
        }
        int yield;
        CUresult r = gs_mm_alloc(dptr, n, 1, &yield);
        gs_gate_leave();
        if (!yield)
            return r;
        gs_gate_yield(); /* others hold the memory: give the GPU back, wait in line with the larger need */
    }
}

GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    REAL_OR_FAIL(cuMemAllocPitch_v2)
    if (!atomic_load_explicit(&gs_mm_on, memory_order_relaxed)) {
        gs_gate_enter(GS_ID_cuMemAllocPitch_v2);
        int on = atomic_load_explicit(&gs_mm_on, memory_order_relaxed);
        if (!on) {
            CUresult r = real(dptr, pitch, w, h, elem);
            gs_gate_leave();
            return r;
        }
        gs_gate_leave();
    }
    if (pitch == NULL || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (w + 511) / 512 * 512; /* the texture pitch alignment of current GPUs */
    CUresult r = cuMemAlloc_v2(dptr, p * h);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr d)
{
    REAL_OR_FAIL(cuMemFree_v2)
    gs_gate_enter(GS_ID_cuMemFree_v2);
    CUresult r;
    if (!atomic_load_explicit(&gs_mm_on, memory_order_relaxed) || gs_mm_free(d, &r) == GS_MM_NOT_OURS)
        r = real(d);
    gs_gate_leave();
    return r;
}

GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    REAL_OR_FAIL(cuMemGetInfo_v2)
    uint64_t b, used;
    if (!gs_mm_budget(&b, &used))
        return real(free, total);
    if (free == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *total = b;
    *free = used < b ? b - used : 0;
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
        gs_gate_enter(id);                                                                         \
        CUresult r_ = call;                                                                        \
        gs_gate_leave();                                                                           \
        return r_;                                                                                 \
    }                                                                                              \
    return call;

GS_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    REAL_OR_FAIL(cuPointerGetAttribute)
    struct gs_mm_info in;
    if (data != NULL && atomic_load_explicit(&gs_mm_on, memory_order_relaxed) && gs_mm_lookup(p, &in) &&
        attribute(data, a, p, &in))
        return CUDA_SUCCESS;
    GATED_IF_VMM(GS_ID_cuPointerGetAttribute, p, real(data, a, p))
}

GS_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
    REAL_OR_FAIL(cuPointerGetAttributes)
    struct gs_mm_info in;
    if (attrs == NULL || data == NULL || !atomic_load_explicit(&gs_mm_on, memory_order_relaxed) ||
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
    REAL_OR_FAIL(cuMemGetAddressRange_v2)
    struct gs_mm_info in;
    if (!atomic_load_explicit(&gs_mm_on, memory_order_relaxed) || !gs_mm_lookup(d, &in)) {
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
    REAL_OR_FAIL(cuIpcGetMemHandle)
    struct gs_mm_info in;
    if (!atomic_load_explicit(&gs_mm_on, memory_order_relaxed) || !gs_mm_lookup(d, &in))
        return real(handle, d);
    static atomic_int warned;
    gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
           "cuIpcGetMemHandle(0x%llx): not supported on swappable memory (legacy CUDA IPC needs memory that "
           "never leaves the GPU; e.g. torch.multiprocessing sharing CUDA tensors). Run this process with "
           "GPUSHARE_OVERSUB=0 to share it",
           (unsigned long long)d);
    return CUDA_ERROR_NOT_SUPPORTED;
}
