/*
 * Device memory outside cuMemAlloc and the VMM calls that the memory limit (cap.c) counts: the device
 * malloc heap and arrays. Neither is swapped; both are charged before the driver is asked and refused
 * with out of memory past the limit, as an allocation is.
 *
 * The heap: cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE) sizes the memory kernels' malloc takes from, which
 * the driver holds for the context. It is charged at the size set (a smaller size gives the difference
 * back); the default heap is part of the context, which the scheduler's ledger measures through NVML.
 *
 * Arrays (cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate) lay texels out in the driver's own
 * tiling, which no call reports. They are charged the texels' bytes (every level of a mipmapped array,
 * every layer of a layered one), in whole granules above half a granule as cuMemAlloc is: a lower bound of what
 * the driver takes, so the limit never refuses an array that would fit, and the driver's padding is
 * left to the claim guard. A format the shim does not size is charged 4 bytes per channel.
 */
#include <stdint.h>

#include "internal.h"

#define REAL_OR_FAIL(name)                                                                         \
    gs_fn_##name real = (gs_fn_##name)gs_real(GS_ID_##name);                                       \
    if (GS_UNLIKELY(real == NULL))                                                                 \
        return CUDA_ERROR_NOT_INITIALIZED;

static CUresult set_heap(uint64_t value)
{
    gs_fn_cuCtxSetLimit real = (gs_fn_cuCtxSetLimit)gs_real(GS_ID_cuCtxSetLimit);
    return real((CUlimit)CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)value);
}

GS_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuCtxSetLimit)
    if (GS_LIKELY(!gs_cap_on()) || limit != CU_LIMIT_MALLOC_HEAP_SIZE)
        return real(limit, value);
    return gs_cap_heap(value, set_heap);
}

/* Bytes per channel of an array format (CUarray_format); 4 for a format not sized here. */
static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case 0x01: /* UNSIGNED_INT8 */
    case 0x08: /* SIGNED_INT8 */
        return 1;
    case 0x02: /* UNSIGNED_INT16 */
    case 0x09: /* SIGNED_INT16 */
    case 0x10: /* HALF */
        return 2;
    default: /* UNSIGNED_INT32, SIGNED_INT32, FLOAT and the rest */
        return 4;
    }
}

#define ARRAY3D_LAYERED 0x01u
#define ARRAY3D_CUBEMAP 0x04u

/* The texels' bytes of levels levels of an array; 0 when they do not fit 64 bits (the driver refuses). */
static uint64_t array_bytes(size_t w, size_t h, size_t d, unsigned flags, CUarray_format f, unsigned ch,
                            unsigned levels)
{
    uint64_t per = format_bytes(f) * (ch == 0 ? 1 : ch), total = 0;
    int layered = (flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP)) != 0;
    for (unsigned l = 0; l < (levels == 0 ? 1 : levels) && l < 64; l++) {
        uint64_t lw = w >> l, lh = h >> l, ld = layered ? d : d >> l;
        lw = lw ? lw : 1;
        lh = h == 0 ? 1 : (lh ? lh : 1);
        ld = d == 0 ? 1 : (ld ? ld : 1);
        if (lw > UINT64_MAX / lh || lw * lh > UINT64_MAX / ld || lw * lh * ld > UINT64_MAX / per)
            return 0;
        uint64_t b = lw * lh * ld * per;
        if (total > UINT64_MAX - b)
            return 0;
        total += b;
    }
    return total;
}

/* Charges bytes (0: too large to count: refused), calls make, keeps or gives back the charge. */
#define CHARGED_ARRAY(id, out, bytes, call)                                                        \
    do {                                                                                           \
        if ((bytes) == 0)                                                                          \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                       \
        uint64_t c_ = gs_cap_size(bytes);                                                          \
        CUresult r_ = gs_cap_charge(c_);                                                           \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
        int gd_ = gs_gate_enter(id);                                                               \
        r_ = call;                                                                                 \
        gs_gate_leave(gd_);                                                                        \
        gs_cap_done(r_, GS_CAP_ARRAY, r_ == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*(out) : 0, c_);  \
        return r_;                                                                                 \
    } while (0)

GS_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuArrayCreate_v2)
    if (GS_LIKELY(!gs_cap_on()) || arr == NULL || desc == NULL || desc->Width == 0)
        return real(arr, desc);
    uint64_t b = array_bytes(desc->Width, desc->Height, 0, 0, desc->Format, desc->NumChannels, 1);
    CHARGED_ARRAY(GS_ID_cuArrayCreate_v2, arr, b, real(arr, desc));
}

GS_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuArray3DCreate_v2)
    if (GS_LIKELY(!gs_cap_on()) || arr == NULL || desc == NULL || desc->Width == 0)
        return real(arr, desc);
    uint64_t b = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Flags, desc->Format, desc->NumChannels, 1);
    CHARGED_ARRAY(GS_ID_cuArray3DCreate_v2, arr, b, real(arr, desc));
}

GS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMipmappedArrayCreate)
    if (GS_LIKELY(!gs_cap_on()) || arr == NULL || desc == NULL || desc->Width == 0)
        return real(arr, desc, levels);
    uint64_t b = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Flags, desc->Format, desc->NumChannels,
                             levels);
    CHARGED_ARRAY(GS_ID_cuMipmappedArrayCreate, arr, b, real(arr, desc, levels));
}

static CUresult destroy(int id, uint64_t key, CUresult (*call)(uint64_t))
{
    if (GS_LIKELY(!gs_cap_any))
        return call(key);
    struct gs_cap_free f;
    gs_cap_free_begin(GS_CAP_ARRAY, key, &f);
    int gd = gs_gate_enter(id);
    CUresult r = call(key);
    gs_gate_leave(gd);
    gs_cap_free_end(&f, r);
    return r;
}

static CUresult destroy_array(uint64_t a)
{
    return ((gs_fn_cuArrayDestroy)gs_real(GS_ID_cuArrayDestroy))((CUarray)(uintptr_t)a);
}

static CUresult destroy_mipmapped(uint64_t a)
{
    return ((gs_fn_cuMipmappedArrayDestroy)gs_real(GS_ID_cuMipmappedArrayDestroy))((CUmipmappedArray)(uintptr_t)a);
}

GS_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuArrayDestroy)
    (void)real;
    return destroy(GS_ID_cuArrayDestroy, (uint64_t)(uintptr_t)arr, destroy_array);
}

GS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMipmappedArrayDestroy)
    (void)real;
    return destroy(GS_ID_cuMipmappedArrayDestroy, (uint64_t)(uintptr_t)arr, destroy_mipmapped);
}
