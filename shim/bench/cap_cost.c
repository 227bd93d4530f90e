/*
 * The memory limit's own cost per allocation, without a GPU: N pairs of cuMemAlloc(4 KiB) and
 * cuMemFree on the stub driver with GPUSHARE_STUB_ALLOC_NOMAP=1 (addresses handed out without
 * memory behind them, so the driver side costs next to nothing) and prints the mean ns per pair.
 * Run it under the shim with and without GPUSHARE_MEMORY_LIMIT_BYTES: the difference is what the
 * limit adds to an allocation and its free (a real cuMemAlloc + cuMemFree pair takes microseconds).
 *   cap_cost N
 */
#include "cuda_abi.h"
#define BENCH_NAME "cap_cost"
#include "bench_dl.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    if (open_driver() != 0)
        return 2;
    alloc_fn alloc = (alloc_fn)sym("cuMemAlloc_v2");
    free_fn mfree = (free_fn)sym("cuMemFree_v2");
    CUdeviceptr live[16];
    for (int i = 0; i < 16; i++) /* a few live allocations, as a program has */
        alloc(&live[i], 4096);
    double t0 = now();
    for (long i = 0; i < n; i++) {
        CUdeviceptr d;
        if (alloc(&d, 4096) != CUDA_SUCCESS || mfree(d) != CUDA_SUCCESS) {
            fprintf(stderr, "cap_cost: allocation failed at %ld\n", i);
            return 1;
        }
    }
    double dt = now() - t0;
    printf("%.1f\n", dt * 1e9 / (double)n);
    return 0;
}
