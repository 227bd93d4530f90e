/*
 * The test application of a process with several shared GPUs (docs/multigpu.md), on the stub driver
 * with GPUSHARE_STUB_DEVICES=2 and the list form of the environment.
 *
 *   multi_client cap L0 L1   fills device 0 with four blocks of L0/4 and device 1 with two of L1/2
 *                            (cuMemAlloc, each device's primary context current), then one more on
 *                            each (refused: each GPU has its own limit), frees one block of device 0
 *                            while device 1's context is current and allocates it again on device 0.
 *                            Prints "multi cap d0_fill=R d0_over=R d0_total=T d1_fill=R d1_over=R
 *                            d1_total=T refill=R" (R: CUresults, 0 success, 2 out of memory; T:
 *                            cuMemGetInfo's total with that device current)
 *   multi_client launch D    one kernel launch on a stream of device D; prints "multi launch dev=D r=R"
 *   multi_client locks GO    a thread launches on device 0 (whose scheduler never grants); once the file
 *                            GO exists (the test creates it when device 0's scheduler has the thread's
 *                            ACQUIRE) the main thread launches on device 1 and prints "multi locks
 *                            dev1=R", then exits without waiting for the thread
 *   multi_client info        prints "multi info d0_total=T d1_total=T" (cuMemGetInfo per device)
 *   multi_client launches N C GO
 *                            connects to both GPUs' schedulers (an allocation on each), waits up to 20 s
 *                            for the file GO (the test creates it once each scheduler heard the bound in
 *                            force), then N launches on a stream of device 0 (device 0 current) and N on
 *                            a stream of device 1 with device C current; prints "multi launches r=R" (R:
 *                            the first failure, else 0)
 *   multi_client acopy       with device 0 current: a memset, a copy in and a copy out on a stream of
 *                            device 1 (of 1 MiB of device 1's memory); prints "multi acopy r=R intact=B"
 *   multi_client vmm         with device 0 current: cuMemCreate of 8 MiB on device 1, reserve, map, set
 *                            access, retain and release the retained handle, then unmap and release;
 *                            prints "multi vmm r=R used=U after=A" (U: device 1's memory in use while
 *                            mapped, A: after, both from cuMemGetInfo with device 1 current)
 *   multi_client oversub N0 N1 GO
 *                            allocates N0 bytes on device 0 and N1 on device 1 (cuMemAlloc, in two
 *                            blocks each), fills each block with its own byte (cuMemsetD8), asks for
 *                            N1 more on device 1 (beyond its budget: refused), prints "multi oversub
 *                            ready", waits up to 20 s for the file GO, reads every block back
 *                            (cuMemcpyDtoH, its device current) and prints "multi
 *                            oversub d0_total=T d1_total=T d1_over=R intact=B" (T: cuMemGetInfo's total
 *                            with that device current; B 1 when every byte came back as written)
 *   multi_client xcopy K N GO (K: dtoh, plain, plainasync, peer or async; plain is dtoh run without
 *                            oversubscription, plainasync reads device 1's block on a stream of device 0)
 *                            one block of N bytes on each device (0xa0 on device 0, 0xb1 on device 1),
 *                            prints "multi xcopy ready", waits up to 20 s for the file GO (the test
 *                            creates it once device 1's memory was swapped out), then with device 0
 *                            current: dtoh reads device 1's block (cuMemcpyDtoH); peer copies device 0's
 *                            block onto device 1's (cuMemcpyPeer) and reads it back; async copies it
 *                            on a stream of device 0 (cuMemcpyDtoDAsync) and reads device 1's block where
 *                            the stub keeps it, without synchronizing (the copy is done when the call
 *                            returns); prints "multi xcopy K r=R intact=B"
 *   multi_client cross N GO  two blocks of N bytes on each device, then (after GO, as xcopy) two threads
 *                            at once, 20 times each: one with device 0 current copies a block of device
 *                            0 onto one of device 1 (cuMemcpyPeer), the other with device 1 current a
 *                            block of device 1 onto one of device 0 (cuMemcpyDtoD); prints "multi cross
 *                            r=R intact=B"
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "resolve.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setctx_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*stream_fn)(CUstream *, unsigned int);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*msetasync_fn)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*htodasync_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dtohasync_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*ssync_fn)(CUstream);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*retainh_fn)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

typedef CUresult (*peer_fn)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
typedef CUresult (*dtod_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*dtodasync_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);

static CUcontext ctx[2];

/* Device d's primary context made current, retained at its first use (a process of NCCL's layout
 * never retains another GPU's); cuCtxSetCurrent is no hook of the shim's: the stub's own. */
static void use(int d)
{
    if (ctx[d] == NULL && ((retain_fn)sym("cuDevicePrimaryCtxRetain"))(&ctx[d], d) != CUDA_SUCCESS) {
        fprintf(stderr, "multi_client: no device %d\n", d);
        exit(2);
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    setctx_fn set = h != NULL ? (setctx_fn)dlsym(h, "cuCtxSetCurrent") : NULL;
    if (set == NULL || set(ctx[d]) != CUDA_SUCCESS) {
        fprintf(stderr, "multi_client: cannot make device %d current\n", d);
        exit(2);
    }
}

static size_t total_of(int d)
{
    use(d);
    size_t f = 0, t = 0;
    if (((info_fn)sym("cuMemGetInfo"))(&f, &t) != CUDA_SUCCESS)
        return 0;
    return t;
}

static CUresult launch(int d)
{
    use(d);
    CUstream s = NULL;
    CUresult r = ((stream_fn)sym("cuStreamCreate"))(&s, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = ((launch_fn)sym("cuLaunchKernel"))((CUfunction)0x1, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    if (r == CUDA_SUCCESS)
        r = ((sync_fn)sym("cuCtxSynchronize"))();
    return r;
}

static int wait_file(const char *path);
static CUresult fill(int d, int n, size_t unit, CUdeviceptr *got);

/* A stream of device d, made with d current; device `cur` current afterwards. */
static CUstream stream_of(int d, int cur)
{
    use(d);
    CUstream s = NULL;
    if (((stream_fn)sym("cuStreamCreate"))(&s, 0) != CUDA_SUCCESS)
        s = NULL;
    use(cur);
    return s;
}

static CUresult launches(int n, int cur1, const char *go)
{
    CUdeviceptr p[2];
    CUresult worst = fill(0, 1, 4096, &p[0]);
    if (worst == CUDA_SUCCESS)
        worst = fill(1, 1, 4096, &p[1]);
    if (worst == CUDA_SUCCESS && !wait_file(go))
        worst = CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < 2; d++) {
        CUstream s = stream_of(d, d == 0 ? 0 : cur1);
        for (int i = 0; i < n; i++) {
            CUresult r = ((launch_fn)sym("cuLaunchKernel"))((CUfunction)0x1, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
            if (r != CUDA_SUCCESS && worst == CUDA_SUCCESS)
                worst = r;
        }
    }
    return worst;
}

static void *launch0(void *arg)
{
    (void)arg;
    launch(0);
    return NULL;
}

static CUresult fill(int d, int n, size_t unit, CUdeviceptr *got)
{
    use(d);
    CUresult worst = CUDA_SUCCESS;
    for (int i = 0; i < n; i++) {
        CUresult r = ((alloc_fn)sym("cuMemAlloc"))(&got[i], unit);
        if (r != CUDA_SUCCESS)
            worst = r;
    }
    return worst;
}

/* Waits up to 20 s for path to exist (the test creates it once the state it checks is reached). */
static int wait_file(const char *path)
{
    for (int i = 0; i < 2000; i++) {
        if (access(path, F_OK) == 0)
            return 1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Every byte of block p (n bytes) is v: read back with whatever context is current. */
static int holds(CUdeviceptr p, size_t n, unsigned char v)
{
    unsigned char *buf = malloc(n);
    int ok = buf != NULL && ((dtoh_fn)sym("cuMemcpyDtoH"))(buf, p, n) == CUDA_SUCCESS;
    for (size_t i = 0; ok && i < n; i++)
        ok = buf[i] == v;
    free(buf);
    return ok;
}

static size_t used_of(int d)
{
    use(d);
    size_t f = 0, t = 0;
    ((info_fn)sym("cuMemGetInfo"))(&f, &t);
    return t - f;
}

static CUresult acopy(int *intact)
{
    size_t n = 1 << 20;
    CUdeviceptr p = 0;
    CUresult r = fill(1, 1, n, &p);
    CUstream s = stream_of(1, 0);
    unsigned char *in = malloc(n), *out = calloc(1, n);
    if (in == NULL || out == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++)
        in[i] = (unsigned char)(i * 7);
    if (r == CUDA_SUCCESS)
        r = ((msetasync_fn)sym("cuMemsetD8Async"))(p, 0x5a, n, s);
    if (r == CUDA_SUCCESS)
        r = ((htodasync_fn)sym("cuMemcpyHtoDAsync"))(p, in, n, s);
    if (r == CUDA_SUCCESS)
        r = ((dtohasync_fn)sym("cuMemcpyDtoHAsync"))(out, p, n, s);
    if (r == CUDA_SUCCESS)
        r = ((ssync_fn)sym("cuStreamSynchronize"))(s);
    *intact = r == CUDA_SUCCESS && memcmp(in, out, n) == 0;
    free(in);
    free(out);
    return r;
}

static CUresult vmm(size_t *used, size_t *after)
{
    size_t n = 8 << 20;
    use(1); /* device 1's context exists, as it would where its memory is used */
    use(0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr va = 0;
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = ((create_fn)sym("cuMemCreate"))(&h, n, &prop, 0);
    if (r == CUDA_SUCCESS)
        r = ((reserve_fn)sym("cuMemAddressReserve"))(&va, n, 0, 0, 0);
    if (r == CUDA_SUCCESS)
        r = ((map_fn)sym("cuMemMap"))(va, n, 0, h, 0);
    if (r == CUDA_SUCCESS)
        r = ((access_fn)sym("cuMemSetAccess"))(va, n, &acc, 1);
    if (r == CUDA_SUCCESS)
        r = ((retainh_fn)sym("cuMemRetainAllocationHandle"))(&h2, (void *)(uintptr_t)va);
    if (r == CUDA_SUCCESS)
        r = ((release_fn)sym("cuMemRelease"))(h2);
    if (r == CUDA_SUCCESS)
        r = ((release_fn)sym("cuMemRelease"))(h); /* the mapping keeps the memory */
    *used = used_of(1);
    use(0);
    if (r == CUDA_SUCCESS)
        r = ((unmap_fn)sym("cuMemUnmap"))(va, n);
    *after = used_of(1);
    return r;
}

static int oversub(size_t n0, size_t n1, const char *go)
{
    CUdeviceptr a[2] = {0}, b[2] = {0}, x = 0;
    int ok = fill(0, 2, n0 / 2, a) == CUDA_SUCCESS;
    for (int i = 0; ok && i < 2; i++)
        ok = ((memset_fn)sym("cuMemsetD8"))(a[i], (unsigned char)(0xa0 + i), n0 / 2) == CUDA_SUCCESS;
    ok = ok && fill(1, 2, n1 / 2, b) == CUDA_SUCCESS;
    for (int i = 0; ok && i < 2; i++)
        ok = ((memset_fn)sym("cuMemsetD8"))(b[i], (unsigned char)(0xb0 + i), n1 / 2) == CUDA_SUCCESS;
    CUresult over = ((alloc_fn)sym("cuMemAlloc"))(&x, n1);
    size_t t0 = total_of(0), t1 = total_of(1);
    printf("multi oversub ready\n");
    fflush(stdout);
    ok = ok && wait_file(go);
    use(1);
    for (int i = 0; ok && i < 2; i++)
        ok = holds(b[i], n1 / 2, (unsigned char)(0xb0 + i));
    use(0);
    for (int i = 0; ok && i < 2; i++)
        ok = holds(a[i], n0 / 2, (unsigned char)(0xa0 + i));
    printf("multi oversub d0_total=%zu d1_total=%zu d1_over=%d intact=%d\n", t0, t1, over, ok);
    return 0;
}

/* One block of n bytes of v on device d (d current); 0 when it failed. */
static CUdeviceptr block(int d, size_t n, unsigned char v)
{
    CUdeviceptr p = 0;
    if (fill(d, 1, n, &p) != CUDA_SUCCESS || ((memset_fn)sym("cuMemsetD8"))(p, v, n) != CUDA_SUCCESS)
        return 0;
    return p;
}

static void ready(const char *mode)
{
    use(0);
    printf("multi %s ready\n", mode);
    fflush(stdout);
}

static int xcopy(const char *kind, size_t n, const char *go)
{
    CUdeviceptr a = block(0, n, 0xa0), b = block(1, n, 0xb1);
    ready("xcopy");
    int ok = a != 0 && b != 0 && wait_file(go);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    use(0);
    if (ok && (!strcmp(kind, "dtoh") || !strcmp(kind, "plain"))) {
        r = CUDA_SUCCESS;
        ok = holds(b, n, 0xb1); /* device 1's memory, device 0 current */
    } else if (ok && !strcmp(kind, "plainasync")) {
        CUstream s = stream_of(0, 0);
        unsigned char *buf = malloc(n);
        r = buf == NULL ? CUDA_ERROR_OUT_OF_MEMORY : ((dtohasync_fn)sym("cuMemcpyDtoHAsync"))(buf, b, n, s);
        if (r == CUDA_SUCCESS)
            r = ((ssync_fn)sym("cuStreamSynchronize"))(s);
        for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++)
            ok = ok && buf[i] == 0xb1;
        free(buf);
    } else if (ok && !strcmp(kind, "peer")) {
        r = ((peer_fn)sym("cuMemcpyPeer"))(b, ctx[1], a, ctx[0], n);
        ok = r == CUDA_SUCCESS && holds(b, n, 0xa0);
    } else if (ok && !strcmp(kind, "async")) {
        r = ((dtodasync_fn)sym("cuMemcpyDtoDAsync"))(b, a, n, stream_of(0, 0));
        /* done when the call returns: read where the stub's device memory is, without synchronizing */
        const unsigned char *v = (const unsigned char *)(uintptr_t)b;
        for (size_t i = 0; r == CUDA_SUCCESS && ok && i < n; i++)
            ok = v[i] == 0xa0;
        ok = ok && r == CUDA_SUCCESS && holds(b, n, 0xa0);
    }
    printf("multi xcopy %s r=%d intact=%d\n", kind, r, ok);
    return 0;
}

struct cross {
    int cur;
    CUdeviceptr dst, src;
    size_t n;
    CUresult r;
};

static void *cross_main(void *arg)
{
    struct cross *c = arg;
    use(c->cur);
    for (int i = 0; i < 20 && c->r == CUDA_SUCCESS; i++)
        c->r = c->cur == 0 ? ((peer_fn)sym("cuMemcpyPeer"))(c->dst, ctx[1], c->src, ctx[0], c->n)
                           : ((dtod_fn)sym("cuMemcpyDtoD"))(c->dst, c->src, c->n);
    return NULL;
}

static int cross(size_t n, const char *go)
{
    CUdeviceptr a = block(0, n, 0xa0), d = block(0, n, 0xd0), b = block(1, n, 0xb1), c = block(1, n, 0xc1);
    ready("cross");
    int ok = a != 0 && b != 0 && c != 0 && d != 0 && wait_file(go);
    struct cross t[2] = {{0, b, a, n, CUDA_SUCCESS}, {1, d, c, n, CUDA_SUCCESS}};
    pthread_t th[2];
    for (int i = 0; ok && i < 2; i++)
        ok = pthread_create(&th[i], NULL, cross_main, &t[i]) == 0;
    for (int i = 0; ok && i < 2; i++)
        pthread_join(th[i], NULL);
    CUresult r = t[0].r != CUDA_SUCCESS ? t[0].r : t[1].r;
    use(0);
    ok = ok && r == CUDA_SUCCESS && holds(b, n, 0xa0) && holds(d, n, 0xc1);
    printf("multi cross r=%d intact=%d\n", r, ok);
    return 0;
}

int main(int argc, char **argv)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL || argc < 2) {
        fprintf(stderr, "usage: multi_client cap L0 L1 | launch D | locks GO | info | launches N C GO | acopy | vmm | oversub N0 N1 GO | xcopy dtoh|plain|plainasync|peer|async N GO | cross N GO\n");
        return 2;
    }
    gpa = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
    if (gpa == NULL)
        return 2;
    ((init_fn)sym("cuInit"))(0);
    if (!strcmp(argv[1], "cap") && argc == 4) {
        size_t l0 = strtoull(argv[2], NULL, 10), l1 = strtoull(argv[3], NULL, 10);
        CUdeviceptr a[4] = {0}, b[2] = {0}, x = 0;
        CUresult f0 = fill(0, 4, l0 / 4, a);
        CUresult o0 = ((alloc_fn)sym("cuMemAlloc"))(&x, l0 / 4);
        size_t t0 = total_of(0);
        CUresult f1 = fill(1, 2, l1 / 2, b);
        CUresult o1 = ((alloc_fn)sym("cuMemAlloc"))(&x, l1 / 2);
        size_t t1 = total_of(1);
        use(1);
        ((free_fn)sym("cuMemFree"))(a[0]); /* device 0's memory, device 1 current */
        use(0);
        CUresult again = ((alloc_fn)sym("cuMemAlloc"))(&a[0], l0 / 4);
        printf("multi cap d0_fill=%d d0_over=%d d0_total=%zu d1_fill=%d d1_over=%d d1_total=%zu refill=%d\n", f0,
               o0, t0, f1, o1, t1, again);
        return 0;
    }
    if (!strcmp(argv[1], "launch") && argc == 3) {
        int d = atoi(argv[2]);
        printf("multi launch dev=%d r=%d\n", d, launch(d));
        return 0;
    }
    if (!strcmp(argv[1], "locks") && argc == 3) {
        pthread_t t;
        pthread_create(&t, NULL, launch0, NULL);
        wait_file(argv[2]);
        printf("multi locks dev1=%d\n", launch(1));
        fflush(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "launches") && argc == 5) {
        printf("multi launches r=%d\n", launches(atoi(argv[2]), atoi(argv[3]), argv[4]));
        return 0;
    }
    if (!strcmp(argv[1], "acopy")) {
        int intact = 0;
        CUresult r = acopy(&intact);
        printf("multi acopy r=%d intact=%d\n", r, intact);
        return 0;
    }
    if (!strcmp(argv[1], "vmm")) {
        size_t used = 0, after = 0;
        CUresult r = vmm(&used, &after);
        printf("multi vmm r=%d used=%zu after=%zu\n", r, used, after);
        return 0;
    }
    if (!strcmp(argv[1], "oversub") && argc == 5)
        return oversub(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10), argv[4]);
    if (!strcmp(argv[1], "xcopy") && argc == 5)
        return xcopy(argv[2], strtoull(argv[3], NULL, 10), argv[4]);
    if (!strcmp(argv[1], "cross") && argc == 4)
        return cross(strtoull(argv[2], NULL, 10), argv[3]);
    if (!strcmp(argv[1], "info")) {
        printf("multi info d0_total=%zu d1_total=%zu\n", total_of(0), total_of(1));
        return 0;
    }
    fprintf(stderr, "multi_client: unknown mode %s\n", argv[1]);
    return 2;
}
