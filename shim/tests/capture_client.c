/*
 * Test client for stream capture and for the memory manager's lock under oversubscription, on the
 * stub driver (stub_capture.c refuses what the real driver refuses during capture). Files named in
 * the arguments are the handshakes with tests/run_tests.sh, which watches the shim's log, the stub's
 * trace and the fake scheduler to decide when each step may go on.
 *
 *   capture_client capture go=PATH swapped=PATH
 *     allocates A (8 MiB) and fills it, and G (2 MiB); begins a global-mode capture on a stream; in it
 *     allocates C (4 MiB) and frees G with the thread in relaxed mode (as PyTorch's allocator does),
 *     queues the XOR kernel on A
 *     and C and a copy of A's first MiB into C; prints "capturing"; waits for PATH go; ends the
 *     capture ("capture_end=<CUresult>"); waits for PATH swapped (memory evicted meanwhile); replays the
 *     graph three times and checks every byte of A and C against a host mirror ("replayed ok").
 *   capture_client lock memreq=PATH release=PATH
 *     allocates a small and a 4 MiB buffer; a second thread allocates 64 MiB (the scheduler holds its
 *     MEMREPLY back until PATH release exists); once PATH memreq exists, this thread allocates and
 *     frees small memory and frees the 4 MiB buffer, then prints "prompt_ms=<ms> big_pending=<0|1>"
 *     (1: it finished while the other thread still waited for the scheduler) and creates PATH release.
 * Exits 1 on a mismatch or a failed call.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "resolve.h"

#define XOR_KERNEL ((CUfunction)(uintptr_t)0x5eed)
#define STREAM ((CUstream)(uintptr_t)0x5000)

static void *lib;

static const char *opt(int argc, char **argv, const char *key)
{
    size_t k = strlen(key);
    for (int i = 2; i < argc; i++)
        if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=')
            return argv[i] + k + 1;
    return "";
}

/* Waits up to 20 s for the test to create path. */
static int wait_file(const char *path)
{
    for (int i = 0; i < 4000; i++) {
        if (access(path, F_OK) == 0)
            return 0;
        usleep(5000);
    }
    fprintf(stderr, "capture_client: %s never came\n", path);
    return -1;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

static CUresult (*alloc)(CUdeviceptr *, size_t);
static CUresult (*dfree)(CUdeviceptr);
static CUresult (*htod)(CUdeviceptr, const void *, size_t);
static CUresult (*dtoh)(void *, CUdeviceptr, size_t);

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult e_ = (call);                                                                      \
        if (e_ != CUDA_SUCCESS) {                                                                  \
            printf("failed %s = %d\n", #call, e_);                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static void xor_mirror(unsigned char *m, size_t n, uint64_t key)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, m + i, 8);
        v ^= key;
        memcpy(m + i, &v, 8);
    }
}

static int check(const char *what, CUdeviceptr d, const unsigned char *m, size_t n)
{
    unsigned char *got = malloc(n);
    if (got == NULL || dtoh(got, d, n) != CUDA_SUCCESS || memcmp(got, m, n) != 0) {
        printf("mismatch in %s\n", what);
        free(got);
        return 1;
    }
    free(got);
    return 0;
}

static int capture(int argc, char **argv)
{
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = sym("cuStreamBeginCapture");
    CUresult (*end)(CUstream, CUgraph *) = sym("cuStreamEndCapture");
    CUresult (*exchange)(CUstreamCaptureMode *) = sym("cuThreadExchangeStreamCaptureMode");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **) = sym("cuLaunchKernel");
    CUresult (*d2d)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = sym("cuMemcpyDtoDAsync");
    CUresult (*inst)(CUgraphExec *, CUgraph, unsigned long long) = sym("cuGraphInstantiateWithFlags");
    CUresult (*glaunch)(CUgraphExec, CUstream) = sym("cuGraphLaunch");
    const size_t na = 8 << 20, nc = 4 << 20, ncopy = 1 << 20;
    const uint64_t ka = 0x0123456789abcdefull, kc = 0xfedcba9876543210ull;
    unsigned char *ma = malloc(na), *mc = calloc(1, nc);
    for (size_t i = 0; i < na; i++)
        ma[i] = (unsigned char)(i * 131 + 7);
    CUdeviceptr a, c, gone;
    CHECK(alloc(&a, na));
    CHECK(htod(a, ma, na));
    CHECK(alloc(&gone, 2 << 20));

    CHECK(begin(STREAM, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    exchange(&mode);
    CHECK(alloc(&c, nc)); /* memory allocated during the capture, used by the graph */
    CHECK(dfree(gone));   /* a free during the capture (cuMemFree synchronizes: not now) */
    exchange(&mode);
    size_t nA = na, nC = nc;
    uint64_t keyA = ka, keyC = kc;
    void *pa[] = {&a, &nA, &keyA}, *pc[] = {&c, &nC, &keyC};
    CHECK(launch(XOR_KERNEL, 1, 1, 1, 1, 1, 1, 0, STREAM, pa, NULL));
    CHECK(d2d(c, a, ncopy, STREAM));
    CHECK(launch(XOR_KERNEL, 1, 1, 1, 1, 1, 1, 0, STREAM, pc, NULL));
    printf("capturing\n");
    fflush(stdout);
    if (wait_file(opt(argc, argv, "go")) != 0)
        return 1;
    CUgraph g = NULL;
    CUresult e = end(STREAM, &g);
    printf("capture_end=%d\n", e);
    fflush(stdout);
    if (e != CUDA_SUCCESS)
        return 1;
    if (wait_file(opt(argc, argv, "swapped")) != 0)
        return 1;
    CUgraphExec x;
    CHECK(inst(&x, g, 0));
    /* C's bytes before the first replay are whatever the allocation held: start from a known state. */
    CHECK(htod(c, mc, nc));
    for (int r = 0; r < 3; r++) {
        CHECK(glaunch(x, STREAM));
        xor_mirror(ma, na, ka);
        memcpy(mc, ma, ncopy);
        xor_mirror(mc, nc, kc);
    }
    if (check("A after replays", a, ma, na) || check("C after replays", c, mc, nc))
        return 1;
    printf("replayed ok\n");
    return 0;
}

static atomic_int big_done;
static CUresult big_result;

static void *big_main(void *arg)
{
    (void)arg;
    CUdeviceptr d;
    big_result = alloc(&d, 64 << 20);
    atomic_store(&big_done, 1);
    return NULL;
}

static int lock(int argc, char **argv)
{
    CUdeviceptr small, mid;
    CHECK(alloc(&small, 4096));
    CHECK(alloc(&mid, 4 << 20));
    pthread_t t;
    pthread_create(&t, NULL, big_main, NULL);
    if (wait_file(opt(argc, argv, "memreq")) != 0)
        return 1;
    uint64_t t0 = now_ms();
    CUdeviceptr s2;
    CHECK(alloc(&s2, 8192)); /* from the slab: needs no budget */
    CHECK(dfree(s2));
    CHECK(dfree(mid));
    uint64_t ms = now_ms() - t0;
    int pending = !atomic_load(&big_done);
    printf("prompt_ms=%llu big_pending=%d\n", (unsigned long long)ms, pending);
    fflush(stdout);
    FILE *f = fopen(opt(argc, argv, "release"), "w");
    if (f != NULL)
        fclose(f);
    pthread_join(t, NULL);
    printf("big_alloc=%d\n", big_result);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "capture_client: %s\n", dlerror());
        return 2;
    }
    gpa = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    ((CUresult(*)(unsigned))dlsym(lib, "cuInit"))(0);
    CUcontext ctx;
    ((CUresult(*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    alloc = sym("cuMemAlloc");
    dfree = sym("cuMemFree");
    htod = sym("cuMemcpyHtoD");
    dtoh = sym("cuMemcpyDtoH");
    int r = strcmp(argv[1], "capture") == 0 ? capture(argc, argv) : strcmp(argv[1], "lock") == 0 ? lock(argc, argv) : 2;
    printf("client exit=%d\n", r);
    return r;
}
