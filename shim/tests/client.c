/*
 * A CUDA "application" for the CPU-only tests. It loads libcuda.so.1 (the stub)
 * with dlopen and reaches the entry points the way real libraries do:
 *   dlsym        dlsym(handle, "cuLaunchKernel")            (PyTorch, Triton)
 *   procaddr     cuGetProcAddress_v2("cuLaunchKernel", ...)  (CUDA runtime >= 12)
 *   procaddr_v1  cuGetProcAddress("cuLaunchKernel", ...)     (CUDA runtime 11.x)
 *   ptsz         cuGetProcAddress_v2 with per-thread default stream flags
 *
 *   client MODE LAUNCHES [SLEEP_US] [CAPTURE_MS] [LINGER_MS]
 * Each iteration launches once and then sleeps SLEEP_US; then it allocates and
 * frees once. With CAPTURE_MS > 0
 * it first begins a stream capture, launches, and only ends the capture after
 * CAPTURE_MS (a holder that cannot release). It synchronizes before exiting
 * and prints "client done pid=P launches=N", then stays alive, idle, for
 * LINGER_MS (so only the shim's idle release can free the lock).
 * With CLIENT_FORK_AT=K in the environment it forks before launch K: the child
 * launches CLIENT_FORK_LAUNCHES times (default 50, same sleep), synchronizes,
 * prints "child done pid=P" and exits; the parent goes on, and before its own
 * "client done" waits for the child and prints "child status=S".
 * With CLIENT_UNTIL_FILE=PATH it keeps launching after LAUNCHES until PATH
 * exists (a test ends the work once the state it drives is reached).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *handle;
static const char *mode;

static void *get(const char *name)
{
    void *p = NULL;
    if (strcmp(mode, "dlsym") == 0) {
        p = dlsym(handle, name);
    } else if (strcmp(mode, "procaddr_v1") == 0) {
        gpa1_fn gpa = (gpa1_fn)dlsym(handle, "cuGetProcAddress");
        if (gpa && gpa(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS)
            p = NULL;
    } else {
        cuuint64_t flags = strcmp(mode, "ptsz") == 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                     : CU_GET_PROC_ADDRESS_DEFAULT;
        gpa2_fn gpa = (gpa2_fn)dlsym(handle, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult st;
        if (gpa && gpa(name, &p, 12000, flags, &st) != CUDA_SUCCESS)
            p = NULL;
    }
    if (p == NULL) {
        fprintf(stderr, "client: cannot resolve %s in mode %s\n", name, mode);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: client dlsym|procaddr|procaddr_v1|ptsz LAUNCHES [SLEEP_US] [CAPTURE_MS] [LINGER_MS]\n");
        return 2;
    }
    mode = argv[1];
    long n = atol(argv[2]);
    long sleep_us = argc > 3 ? atol(argv[3]) : 0;
    long capture_ms = argc > 4 ? atol(argv[4]) : 0;
    long linger_ms = argc > 5 ? atol(argv[5]) : 0;
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        fprintf(stderr, "client: %s\n", dlerror());
        return 2;
    }
    /* Through dlsym, always: these are not what the test is about. */
    init_fn init = (init_fn)dlsym(handle, "cuInit");
    sync_fn sync = (sync_fn)dlsym(handle, "cuCtxSynchronize");
    retain_fn retain = (retain_fn)dlsym(handle, "cuDevicePrimaryCtxRetain");
    init(0);
    CUcontext ctx;
    retain(&ctx, 0);

    const char *launch_name = "cuLaunchKernel";
    launch_fn launch = (launch_fn)get(launch_name);
    alloc_fn alloc = (alloc_fn)get(strcmp(mode, "dlsym") == 0 ? "cuMemAlloc_v2" : "cuMemAlloc");
    free_fn mfree = (free_fn)get(strcmp(mode, "dlsym") == 0 ? "cuMemFree_v2" : "cuMemFree");

    CUstream cap_stream = (CUstream)(uintptr_t)0x5000;
    end_fn end = NULL;
    if (capture_ms > 0) {
        begin_fn begin = (begin_fn)dlsym(handle, "cuStreamBeginCapture_v2");
        end = (end_fn)dlsym(handle, "cuStreamEndCapture");
        begin(cap_stream, 0);
    }
    const char *fork_at_s = getenv("CLIENT_FORK_AT");
    long fork_at = fork_at_s ? atol(fork_at_s) : -1;
    pid_t child = -1;
    const char *until_file = getenv("CLIENT_UNTIL_FILE");
    long launched = 0;
    for (long i = 0; i < n || (until_file != NULL && access(until_file, F_OK) != 0); i++, launched++) {
        if (i == fork_at) {
            fflush(stdout);
            child = fork();
            if (child == 0) {
                const char *m = getenv("CLIENT_FORK_LAUNCHES");
                long k = m ? atol(m) : 50;
                for (long j = 0; j < k; j++) {
                    if (launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
                        fprintf(stderr, "client: child launch failed\n");
                        exit(1);
                    }
                    if (sleep_us > 0)
                        usleep((useconds_t)sleep_us);
                }
                sync();
                printf("child done pid=%d\n", (int)getpid());
                fflush(stdout);
                exit(0);
            }
            printf("forked child pid=%d\n", (int)child);
            fflush(stdout);
        }
        if (launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
            fprintf(stderr, "client: launch failed\n");
            return 1;
        }
        if (sleep_us > 0)
            usleep((useconds_t)sleep_us);
    }
    if (capture_ms > 0) {
        usleep((useconds_t)(capture_ms * 1000));
        CUgraph g;
        end(cap_stream, &g);
    }
    /* Memory calls after the launches, so the first call that waits for the
     * lock is the launch reached through MODE. */
    CUdeviceptr d = 0;
    alloc(&d, 1 << 20);
    mfree(d);
    sync();
    if (child > 0) {
        int status = -1;
        waitpid(child, &status, 0);
        printf("child status=%d\n", status);
    }
    printf("client done pid=%d launches=%ld\n", (int)getpid(), launched);
    fflush(stdout);
    if (linger_ms > 0)
        usleep((useconds_t)(linger_ms * 1000));
    return 0;
}
