/*
 * The claim ledger's test application, on the stub driver (run with GPUSHARE_MEMORY_LIMIT_BYTES and a
 * scheduler that gives a ledger).
 *
 *   ledger_client fill [HOLD_FILE [START_FILE]]
 *     Asks cuMemGetInfo, allocates exactly the free memory it reports (48 MiB pieces, then the rest) with
 *     cuMemAlloc, then 1 MiB more, which must fail. Prints
 *       ledger fill total=T free=F got=G over=R free_after=A
 *     then, with HOLD_FILE, prints "ledger holding" and waits (at most 60 s) until that file exists;
 *     then frees everything and prints "ledger freed free=F" and "client done".
 *   With START_FILE, it waits (at most 60 s) after its context until that file exists before it fills.
 *   Both first retain the primary context and print "ledger ctx r=R"; a refused context (the claim's
 *   ledger has no room for it) ends the run there, with "client done" (the application saw the error).
 *   ledger_client one
 *     One cuMemAlloc of 1 MiB; prints "ledger one r=R ms=M" (its result and how long it took).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ledger_client fill [HOLD_FILE] | one\n");
        return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "ledger_client: %s\n", dlerror());
        return 2;
    }
    ((init_fn)dlsym(lib, "cuInit"))(0);
    CUcontext ctx = NULL;
    CUresult cr = ((retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    printf("ledger ctx r=%d\n", cr);
    fflush(stdout);
    if (cr != CUDA_SUCCESS) {
        printf("client done\n");
        return 0;
    }
    alloc_fn alloc = (alloc_fn)dlsym(lib, "cuMemAlloc_v2");
    free_fn release = (free_fn)dlsym(lib, "cuMemFree_v2");
    info_fn info = (info_fn)dlsym(lib, "cuMemGetInfo_v2");
    if (!strcmp(argv[1], "one")) {
        CUdeviceptr d = 0;
        double t0 = now_ms();
        CUresult r = alloc(&d, 1 << 20);
        printf("ledger one r=%d ms=%.0f\n", r, now_ms() - t0);
        printf("client done\n");
        return 0;
    }
    if (argc > 3) {
        printf("ledger waiting\n");
        fflush(stdout);
        for (int i = 0; i < 6000 && access(argv[3], F_OK) != 0; i++)
            usleep(10000);
    }
    size_t fr = 0, tot = 0;
    info(&fr, &tot);
    static CUdeviceptr got[4096];
    int n = 0;
    size_t left = fr, piece = 48u << 20, total_got = 0;
    while (left > 0 && n < 4096) {
        size_t want = left < piece ? left : piece;
        if (alloc(&got[n], want) != CUDA_SUCCESS)
            break;
        n++;
        left -= want;
        total_got += want;
    }
    CUdeviceptr extra = 0;
    CUresult over = alloc(&extra, 1 << 20);
    size_t fa = 0;
    info(&fa, &tot);
    printf("ledger fill total=%zu free=%zu got=%zu over=%d free_after=%zu\n", tot, fr, total_got, over, fa);
    fflush(stdout);
    if (argc > 2) {
        printf("ledger holding\n");
        fflush(stdout);
        for (int i = 0; i < 6000 && access(argv[2], F_OK) != 0; i++)
            usleep(10000);
    }
    for (int i = 0; i < n; i++)
        release(got[i]);
    if (extra != 0)
        release(extra);
    info(&fa, &tot);
    printf("ledger freed free=%zu\n", fa);
    printf("client done\n");
    return 0;
}
