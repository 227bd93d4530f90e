/*
 * What the stand-alone benchmarks share: opening the driver and making device 0's primary context
 * current, its entry points by name, and a monotonic clock. Each includes it after defining BENCH_NAME, which prefixes the
 * message when a symbol is missing.
 */
#ifndef GS_BENCH_DL_H
#define GS_BENCH_DL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*push_fn)(CUcontext);

static void *lib;

static void *sym(const char *n)
{
    void *p = dlsym(lib, n);
    if (p == NULL) {
        fprintf(stderr, BENCH_NAME ": no %s\n", n);
        exit(2);
    }
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Opens libcuda, initialises it and makes device 0's primary context current; 0 on success. */
static int open_driver(void)
{
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, BENCH_NAME ": %s\n", dlerror());
        return -1;
    }
    ((init_fn)sym("cuInit"))(0);
    CUcontext ctx;
    if (((retain_fn)sym("cuDevicePrimaryCtxRetain"))(&ctx, 0) != CUDA_SUCCESS)
        return -1;
    ((push_fn)sym("cuCtxPushCurrent_v2"))(ctx);
    return 0;
}

#endif
