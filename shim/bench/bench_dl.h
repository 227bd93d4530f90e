/*
 * What the stand-alone benchmarks share: the driver's entry points by name from the library they
 * opened (lib), and a monotonic clock. Each includes it after defining BENCH_NAME, which prefixes the
 * message when a symbol is missing.
 */
#ifndef GS_BENCH_DL_H
#define GS_BENCH_DL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

#endif
