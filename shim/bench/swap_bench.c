/*
 * Swap-rate benchmark helper (driver API, loads libcuda with dlopen, builds with gcc).
 *   swap_bench copy BYTES REPS          plain pinned copies, no shim: prints the median
 *                                       "copy out=GB/s in=GB/s" of REPS device<->host copies
 *   swap_bench hold BYTES CHUNK SECS    allocates BYTES in CHUNK-sized cuMemAlloc calls, fills
 *                                       each with its own pattern, then for SECS touches every
 *                                       allocation each millisecond (so under the shim it needs
 *                                       all of them resident whenever it runs), then checks the
 *                                       first and last 4 KiB of each: "hold done ok=1"
 * Run "hold" twice under the shim with a budget that fits only one: every
 * hand-off swaps one whole working set out and the other in, and the shim logs
 * each swap with its rate (GPUSHARE_LOG_LEVEL=info).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*halloc_fn)(void **, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*set32_fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*sync_fn)(void);

#define BENCH_NAME "swap_bench"
#include "bench_dl.h"

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: swap_bench copy BYTES REPS | hold BYTES CHUNK SECS\n");
        return 2;
    }
    if (open_driver() != 0)
        return 2;
    alloc_fn alloc = (alloc_fn)sym("cuMemAlloc_v2");
    halloc_fn halloc = (halloc_fn)sym("cuMemAllocHost_v2");
    dtoh_fn dtoh = (dtoh_fn)sym("cuMemcpyDtoH_v2");
    htod_fn htod = (htod_fn)sym("cuMemcpyHtoD_v2");
    set32_fn set32 = (set32_fn)sym("cuMemsetD32_v2");
    sync_fn sync = (sync_fn)sym("cuCtxSynchronize");
    size_t bytes = strtoull(argv[2], NULL, 10);

    if (strcmp(argv[1], "copy") == 0) {
        int reps = atoi(argv[3]);
        CUdeviceptr d;
        void *h;
        if (alloc(&d, bytes) != CUDA_SUCCESS || halloc(&h, bytes) != CUDA_SUCCESS) {
            fprintf(stderr, "swap_bench: allocation failed\n");
            return 1;
        }
        set32(d, 7, bytes / 4);
        memset(h, 1, bytes);
        sync();
        double out[64], in[64];
        for (int i = 0; i < reps && i < 64; i++) {
            double t0 = now();
            dtoh(h, d, bytes);
            double t1 = now();
            htod(d, h, bytes);
            double t2 = now();
            out[i] = bytes / (t1 - t0) / 1e9;
            in[i] = bytes / (t2 - t1) / 1e9;
        }
        qsort(out, (size_t)reps, sizeof(double), cmpd);
        qsort(in, (size_t)reps, sizeof(double), cmpd);
        printf("copy bytes=%zu out=%.2f in=%.2f (GB/s, median of %d)\n", bytes, out[reps / 2], in[reps / 2], reps);
        return 0;
    }
    if (strcmp(argv[1], "hold") == 0 && argc >= 5) {
        size_t chunk = strtoull(argv[3], NULL, 10);
        double secs = atof(argv[4]);
        size_t n = (bytes + chunk - 1) / chunk;
        CUdeviceptr *d = calloc(n, sizeof(*d));
        for (size_t i = 0; i < n; i++) {
            CUresult r = alloc(&d[i], chunk);
            if (r != CUDA_SUCCESS) {
                fprintf(stderr, "swap_bench: allocation %zu failed: %d\n", i, r);
                return 1;
            }
            set32(d[i], (unsigned)(0x1000 + i) * 2654435761u, chunk / 4);
        }
        sync();
        printf("hold allocated %zu x %zu\n", n, chunk);
        fflush(stdout);
        double end = now() + secs;
        long rounds = 0;
        while (now() < end) {
            for (size_t i = 0; i < n; i++)
                set32(d[i], (unsigned)(0x1000 + i) * 2654435761u, 1024); /* same values: touches, keeps the pattern */
            sync();
            rounds++;
            usleep(1000);
        }
        unsigned *buf = malloc(4096);
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++) {
            unsigned want = (unsigned)(0x1000 + i) * 2654435761u;
            for (int part = 0; part < 2 && ok; part++) {
                dtoh(buf, d[i] + (part ? chunk - 4096 : 0), 4096);
                for (int k = 0; k < 1024; k++)
                    ok &= buf[k] == want;
            }
        }
        printf("hold done ok=%d rounds=%ld\n", ok, rounds);
        return ok ? 0 : 1;
    }
    fprintf(stderr, "swap_bench: unknown mode\n");
    return 2;
}
