/*
 * cuGetProcAddress and cuGetProcAddress_v2: how the CUDA runtime, cuBLAS,
 * cuDNN, Triton ... build their own tables of driver entry points. We ask the
 * real driver first, with the caller's cudaVersion and flags untouched, and
 * substitute our hook only when the driver returned a symbol.
 */
#include "internal.h"

GS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    gs_fn_cuGetProcAddress real = (gs_fn_cuGetProcAddress)gs_real(GS_ID_cuGetProcAddress);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL)
        *pfn = gs_substitute(symbol, *pfn);
    return r;
}

GS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus)
{
    gs_fn_cuGetProcAddress_v2 real = (gs_fn_cuGetProcAddress_v2)gs_real(GS_ID_cuGetProcAddress_v2);
    if (GS_UNLIKELY(real == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL)
        *pfn = gs_substitute(symbol, *pfn);
    return r;
}
