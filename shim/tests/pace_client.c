/*
 * A CUDA "application" for the launch-bound tests (tests/run_tests.sh): launches through the entry
 * point named, on the stub driver, and says how far it got, so a test that holds the stub's "GPU"
 * (GPUSHARE_STUB_RUN_FILE) sees where the shim makes it wait.
 *   pace_client launch ENTRY N    N launches through ENTRY: kernel, kernel_ptsz, ex, ex_ptsz, coop,
 *                                 coop_ptsz, grid_async, graph, graph_ptsz (the legacy stream; the
 *                                 _ptsz ones the per-thread stream)
 *   pace_client capture N         launches N kernels and synchronizes, begins a global-mode capture on
 *                                 one stream, launches N kernels on it and N on another stream, ends the
 *                                 capture ("capture_end=R"), launches the graph, then N kernels more on
 *                                 the other stream
 *   pace_client ctxgone N         N kernels, cuCtxDestroy, a new context (the stub hands out the same
 *                                 handle), N kernels more
 *   pace_client primary N         the same with cuDevicePrimaryCtxRelease and a new retain
 *   pace_client threads T N       T threads launch N kernels each, each on a stream of its own
 * Prints "launched N" after its launches (before synchronizing), then "client done". Every launch must
 * succeed; a failure prints "launch failed" and exits 1. With PACE_CLIENT_THEN=PATH, launch mode then
 * waits until PATH exists and makes its N launches again ("launched 2N").
 * PACE_CLIENT_STREAM=HEX: launch mode's stream instead of the default one.
 * Its first GPU call is an allocation, as an application's is: the shim connects to the scheduler then,
 * and the scheduler's bound (sent with WELCOME, before the GRANT) is in force from the first launch.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*grid_fn)(CUfunction, int, int, CUstream);
typedef CUresult (*glaunch_fn)(CUgraphExec, CUstream);
typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);
typedef CUresult (*inst_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*create_fn)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*dev_fn)(CUdevice);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static void *handle;

static void *sym(const char *name)
{
    void *p = dlsym(handle, name);
    if (p == NULL) {
        fprintf(stderr, "pace_client: cannot resolve %s\n", name);
        exit(2);
    }
    return p;
}

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        printf("launch failed: %s = %d\n", what, r);
        fflush(stdout);
        exit(1);
    }
}

static CUgraphExec graph; /* an empty graph, made once */

static void make_graph(void)
{
    CUstream g = (CUstream)(uintptr_t)0x7000;
    CUgraph gr;
    check(((begin_fn)sym("cuStreamBeginCapture_v2"))(g, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
    check(((end_fn)sym("cuStreamEndCapture"))(g, &gr), "end capture");
    check(((inst_fn)sym("cuGraphInstantiateWithFlags"))(&graph, gr, 0), "instantiate");
}

/* One launch through entry on stream s. */
static void launch_one(const char *entry, CUstream s)
{
    if (strcmp(entry, "kernel") == 0 || strcmp(entry, "kernel_ptsz") == 0) {
        launch_fn f = (launch_fn)sym(strcmp(entry, "kernel") == 0 ? "cuLaunchKernel" : "cuLaunchKernel_ptsz");
        check(f(NULL, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), entry);
    } else if (strcmp(entry, "ex") == 0 || strcmp(entry, "ex_ptsz") == 0) {
        ex_fn f = (ex_fn)sym(strcmp(entry, "ex") == 0 ? "cuLaunchKernelEx" : "cuLaunchKernelEx_ptsz");
        CUlaunchConfig c = {1, 1, 1, 1, 1, 1, 0, s, NULL, 0};
        check(f(&c, NULL, NULL, NULL), entry);
    } else if (strcmp(entry, "coop") == 0 || strcmp(entry, "coop_ptsz") == 0) {
        coop_fn f = (coop_fn)sym(strcmp(entry, "coop") == 0 ? "cuLaunchCooperativeKernel"
                                                             : "cuLaunchCooperativeKernel_ptsz");
        check(f(NULL, 1, 1, 1, 1, 1, 1, 0, s, NULL), entry);
    } else if (strcmp(entry, "grid_async") == 0) {
        check(((grid_fn)sym("cuLaunchGridAsync"))(NULL, 1, 1, s), entry);
    } else if (strcmp(entry, "graph") == 0 || strcmp(entry, "graph_ptsz") == 0) {
        if (graph == NULL)
            make_graph();
        glaunch_fn f = (glaunch_fn)sym(strcmp(entry, "graph") == 0 ? "cuGraphLaunch" : "cuGraphLaunch_ptsz");
        check(f(graph, s), entry);
    } else {
        fprintf(stderr, "pace_client: unknown entry point %s\n", entry);
        exit(2);
    }
}

static void launch_n(const char *entry, CUstream s, long n)
{
    for (long i = 0; i < n; i++)
        launch_one(entry, s);
}

static long per_thread;

static void *thread_main(void *arg)
{
    launch_n("kernel", (CUstream)arg, per_thread);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: pace_client launch ENTRY N | capture N | ctxgone N | primary N | threads T N\n");
        return 2;
    }
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        fprintf(stderr, "pace_client: %s\n", dlerror());
        return 2;
    }
    ((init_fn)sym("cuInit"))(0);
    CUcontext ctx;
    check(((retain_fn)sym("cuDevicePrimaryCtxRetain"))(&ctx, 0), "retain");
    CUdeviceptr d;
    check(((alloc_fn)sym("cuMemAlloc_v2"))(&d, 1 << 20), "alloc");
    check(((free_fn)sym("cuMemFree_v2"))(d), "free");
    const char *mode = argv[1];
    long launched = 0;
    if (strcmp(mode, "launch") == 0 && argc > 3) {
        launched = atol(argv[3]);
        const char *sv = getenv("PACE_CLIENT_STREAM");
        CUstream s = sv != NULL ? (CUstream)(uintptr_t)strtoul(sv, NULL, 16) : NULL;
        launch_n(argv[2], s, launched);
        const char *then = getenv("PACE_CLIENT_THEN");
        if (then != NULL) {
            printf("launched %ld\n", launched);
            fflush(stdout);
            while (access(then, F_OK) != 0)
                usleep(2000);
            launch_n(argv[2], s, launched);
            launched *= 2;
        }
    } else if (strcmp(mode, "capture") == 0) {
        long n = atol(argv[2]);
        CUstream a = (CUstream)(uintptr_t)0x5000, b = (CUstream)(uintptr_t)0x6000;
        launch_n("kernel", b, n); /* the bound's events exist, and are done, when the capture begins */
        check(((sync_fn)sym("cuCtxSynchronize"))(), "synchronize");
        check(((begin_fn)sym("cuStreamBeginCapture_v2"))(a, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
        launch_n("kernel", a, n);
        launch_n("kernel", b, n);
        printf("capture launched %ld\n", 2 * n);
        fflush(stdout);
        CUgraph g;
        CUresult r = ((end_fn)sym("cuStreamEndCapture"))(a, &g);
        printf("capture_end=%d\n", r);
        fflush(stdout);
        if (r == CUDA_SUCCESS) {
            CUgraphExec x;
            check(((inst_fn)sym("cuGraphInstantiateWithFlags"))(&x, g, 0), "instantiate");
            check(((glaunch_fn)sym("cuGraphLaunch"))(x, b), "graph launch");
        }
        launch_n("kernel", b, n);
        launched = 4 * n + 1;
    } else if (strcmp(mode, "ctxgone") == 0 || strcmp(mode, "primary") == 0) {
        long n = atol(argv[2]);
        launch_n("kernel", NULL, n);
        check(((sync_fn)sym("cuCtxSynchronize"))(), "synchronize");
        if (strcmp(mode, "ctxgone") == 0) {
            check(((ctx_fn)sym("cuCtxDestroy_v2"))(ctx), "destroy");
            check(((create_fn)sym("cuCtxCreate_v2"))(&ctx, 0, 0), "create");
        } else {
            check(((dev_fn)sym("cuDevicePrimaryCtxRelease_v2"))(0), "release");
            check(((retain_fn)sym("cuDevicePrimaryCtxRetain"))(&ctx, 0), "retain again");
        }
        printf("context renewed\n");
        fflush(stdout);
        launch_n("kernel", NULL, n);
        launched = 2 * n;
    } else if (strcmp(mode, "threads") == 0 && argc > 3) {
        int t = atoi(argv[2]);
        per_thread = atol(argv[3]);
        pthread_t th[64];
        for (int i = 0; i < t && i < 64; i++)
            pthread_create(&th[i], NULL, thread_main, (void *)(uintptr_t)(0x8000 + 0x100 * i));
        for (int i = 0; i < t && i < 64; i++)
            pthread_join(th[i], NULL);
        launched = t * per_thread;
    } else {
        fprintf(stderr, "pace_client: unknown mode %s\n", mode);
        return 2;
    }
    printf("launched %ld\n", launched);
    fflush(stdout);
    check(((sync_fn)sym("cuCtxSynchronize"))(), "synchronize");
    printf("client done\n");
    fflush(stdout);
    return 0;
}
