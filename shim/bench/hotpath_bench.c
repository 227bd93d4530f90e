/*
 * The shim's own cost per launch, without a GPU: calls cuLaunchKernel of the
 * stub driver (which returns at once when GPUSHARE_STUB_LAUNCH_US=0) N times
 * and prints the mean ns per call. Run it with and without LD_PRELOAD of the
 * shim (and a scheduler, so the lock is held): the difference is the hook's
 * fast path, free of the GPU driver's own run-to-run noise.
 *   hotpath_bench N
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_abi.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    launch_fn launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    for (int i = 0; i < 1000; i++) /* take the lock */
        launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    long long best = -1;
    for (int rep = 0; rep < 5; rep++) {
        long long t0 = now_ns();
        for (long i = 0; i < n; i++)
            launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        long long d = now_ns() - t0;
        if (best < 0 || d < best)
            best = d;
    }
    printf("hotpath: %.1f ns per cuLaunchKernel call (best of 5 x %ld)\n", (double)best / (double)n, n);
    return 0;
}
