/*
 * A CUDA "application" for the oversubscription tests, on the stub driver
 * (device memory is host memory). It keeps a host mirror of every device
 * buffer, changes the buffers at random through the driver (copies in,
 * device-to-device copies, memsets, and the stub's XOR "kernel", which runs
 * asynchronously), and compares device contents with the mirror, so any byte
 * lost or stale across a swap shows up.
 *
 *   oversub_client key=value ...
 *     bufs=N size=BYTES    N large buffers (default 4 x 8 MiB)
 *     small=N              N small buffers of 1..96 KiB (slab-packed; default 16)
 *     iters=N              random operations (default 1000), sleep_us=US between them
 *     until_file=PATH      after the iters operations, keep going until PATH exists (a test ends the work
 *                          when the state it drives is reached, not after a count that a loaded machine
 *                          may finish early)
 *     verify_every=N       full comparison every N operations (default 100)
 *     capture_ms=MS        first begin a stream capture, stay idle MS ms, end it
 *     hold_ms=MS           after the work, stay alive and idle MS ms
 *     hold_until=PATH      after the work (and hold_ms), stay idle until PATH exists (the test says when
 *                          the state it checks during the hold was observed)
 *     recheck=1            after the hold, check every byte once more (memory evicted meanwhile comes back)
 *     keep_freed=N         alloc=async: before the hold, free the first N large buffers (the shim keeps them)
 *     trim_file=PATH       during the hold, a second thread calls cuMemPoolTrimTo(0) once PATH exists (a call
 *                          that does not wait for the GPU: it frees kept memory while an eviction may be running)
 *     churn_thread=1       alloc=async: the churn frees and allocates on a second thread (as
 *                          PyTorch's autograd thread does), default stream
 *     idle_until=PATH      after freeing everything (and idle_after_free_ms), stay idle until PATH exists
 *     idle_after_free_ms=MS after freeing everything, stay alive and idle MS ms (stream-ordered
 *                          memory is then kept by the pool, unused)
 *     big=BYTES            also try one allocation of BYTES and report its result
 *     alloc=plain|async|vmm how the large and small buffers are allocated:
 *                          plain  cuMemAlloc / cuMemFree
 *                          async  cuMemAllocAsync / cuMemFreeAsync on two streams (PyTorch's
 *                                 backend:cudaMallocAsync); the loop also frees buffers and
 *                                 allocates them again (reuse), and the pool's counters are checked
 *                          vmm    large buffers are the application's own VMM (PyTorch's
 *                                 expandable_segments): a reserved range, 2 MiB cuMemCreate
 *                                 handles mapped into it (every other one released right after
 *                                 mapping), access set over the whole range; the loop also unmaps
 *                                 the last segment and maps a new one (shrink and grow), right
 *                                 after a kernel over the buffer, the stream synchronized first
 *     seed=N
 * Prints "oversub ..." lines; exits 1 on the first mismatch.
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

#define XOR_KERNEL ((CUfunction)(uintptr_t)0x5eed)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*dtod_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*set8_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*ipc_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);

static void *lib;

static long opt(int argc, char **argv, const char *key, long def)
{
    size_t k = strlen(key);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=')
            return atol(argv[i] + k + 1);
    return def;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static htod_fn htod;

struct buf {
    CUdeviceptr d;
    size_t n;
    unsigned char *m; /* mirror */
    int kind;         /* how it was allocated: PLAIN, ASYNC, VMM */
    CUmemGenericAllocationHandle *h; /* VMM: per segment, 0 where released after mapping */
};

enum { PLAIN, ASYNC, VMM };

typedef CUresult (*allocasync_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*freeasync_fn)(CUdeviceptr, CUstream);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*retain_h_fn)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*props_fn)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
typedef CUresult (*export_fn)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
typedef CUresult (*pool_fn)(CUmemoryPool *, CUdevice);
typedef CUresult (*poolattr_fn)(CUmemoryPool, CUmemPool_attribute, void *);

#define SEG (2u << 20)
#define STREAM_A ((CUstream)(uintptr_t)0x5100)
#define STREAM_B ((CUstream)(uintptr_t)0x5200)

static allocasync_fn allocasync;
static freeasync_fn freeasync;
static create_fn mcreate;
static map_fn mmap_;
static unmap_fn munmap_;
static release_fn mrelease;
static access_fn maccess;
static CUresult (*stream_sync)(CUstream);

static void resolve_alloc_kinds(void)
{
    allocasync = (allocasync_fn)sym("cuMemAllocAsync");
    freeasync = (freeasync_fn)sym("cuMemFreeAsync");
    mcreate = (create_fn)sym("cuMemCreate");
    mmap_ = (map_fn)sym("cuMemMap");
    munmap_ = (unmap_fn)sym("cuMemUnmap");
    mrelease = (release_fn)sym("cuMemRelease");
    maccess = (access_fn)sym("cuMemSetAccess");
    stream_sync = (CUresult(*)(CUstream))sym("cuStreamSynchronize");
}

/* cuMemUnmap does not wait for work queued on the memory (on a GPU that work would then fault):
 * like PyTorch before it unmaps an expandable segment, wait for the stream that works on it. */
static CUresult vmm_unmap(CUdeviceptr d, size_t n)
{
    CUresult r = stream_sync(NULL);
    return r != CUDA_SUCCESS ? r : munmap_(d, n);
}

static CUmemAllocationProp dev_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    return p;
}

/* One 2 MiB segment of a VMM buffer: created, mapped, readable and writable; k odd: released at once. */
static CUresult vmm_segment(struct buf *b, size_t k)
{
    CUmemAllocationProp p = dev_prop();
    CUmemGenericAllocationHandle h;
    CUresult r = mcreate(&h, SEG, &p, 0);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = mmap_(b->d + k * SEG, SEG, 0, h, 0)) != CUDA_SUCCESS)
        return r;
    CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if ((r = maccess(b->d + k * SEG, SEG, &d, 1)) != CUDA_SUCCESS)
        return r;
    b->h[k] = h;
    if (k % 2 == 1) {
        b->h[k] = 0;
        return mrelease(h); /* the memory stays while mapped, as with the driver */
    }
    return CUDA_SUCCESS;
}

static CUresult vmm_alloc(struct buf *b, size_t n)
{
    reserve_fn reserve = (reserve_fn)sym("cuMemAddressReserve");
    size_t segs = (n + SEG - 1) / SEG;
    b->n = segs * SEG;
    b->h = calloc(segs, sizeof(*b->h));
    CUresult r = reserve(&b->d, b->n, SEG, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemAllocationProp p = dev_prop();
    for (size_t k = 0; k < segs; k++) {
        CUmemGenericAllocationHandle h;
        if ((r = mcreate(&h, SEG, &p, 0)) != CUDA_SUCCESS || (r = mmap_(b->d + k * SEG, SEG, 0, h, 0)) != CUDA_SUCCESS)
            return r;
        b->h[k] = h;
    }
    /* access over the whole range, across every mapping, as PyTorch does */
    CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if ((r = maccess(b->d, b->n, &d, 1)) != CUDA_SUCCESS)
        return r;
    for (size_t k = 1; k < segs; k += 2) {
        r = mrelease(b->h[k]);
        b->h[k] = 0;
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

/* Unmaps the whole range in one call (over many mappings) and releases what is still held. */
static CUresult vmm_free(struct buf *b)
{
    CUresult r = vmm_unmap(b->d, b->n);
    for (size_t k = 0; r == CUDA_SUCCESS && k < b->n / SEG; k++)
        if (b->h[k] != 0)
            r = mrelease(b->h[k]);
    return r;
}

static CUresult alloc_kind(struct buf *b, size_t n, int kind, CUstream s, alloc_fn alloc)
{
    b->kind = kind;
    b->n = n;
    if (kind == ASYNC)
        return allocasync(&b->d, n, s);
    if (kind == VMM)
        return vmm_alloc(b, n);
    return alloc(&b->d, n);
}

static CUresult free_kind(struct buf *b, CUstream s, free_fn mfree)
{
    if (b->kind == ASYNC)
        return freeasync(b->d, s);
    if (b->kind == VMM)
        return vmm_free(b);
    return mfree(b->d);
}

/* Stays idle until the file named by the option key=PATH exists (no option: returns at once). */
static void idle_until(int argc, char **argv, const char *key)
{
    size_t k = strlen(key);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=')
            while (access(argv[i] + k + 1, F_OK) != 0)
                usleep(1000);
}

static const char *trim_file;
static void *trim_main(void *arg)
{
    (void)arg;
    while (access(trim_file, F_OK) != 0)
        usleep(1000);
    CUmemoryPool pool;
    ((CUresult(*)(CUmemoryPool *, CUdevice))sym("cuDeviceGetDefaultMemPool"))(&pool, 0);
    CUresult r = ((CUresult(*)(CUmemoryPool, size_t))sym("cuMemPoolTrimTo"))(pool, 0);
    printf("oversub trimmed_during_hold=%d\n", r == CUDA_SUCCESS);
    fflush(stdout);
    return NULL;
}

/* The churn of a thread with no context of its own, on the legacy default stream. */
static int churn_ok;
static void *churn_main(void *arg)
{
    struct buf *x = arg;
    churn_ok = freeasync(x->d, NULL) == CUDA_SUCCESS && allocasync(&x->d, x->n, NULL) == CUDA_SUCCESS;
    return NULL;
}

static void fill(struct buf *b, size_t off, size_t len)
{
    for (size_t k = 0; k < len; k++)
        b->m[off + k] = (unsigned char)rnd();
    htod(b->d + off, b->m + off, len);
}

/* The stub's asynchronous XOR "kernel" over the buffer's whole 64-bit words, and the same on the mirror. */
static void xor_kernel(struct buf *x, launch_fn launch)
{
    uint64_t key = rnd();
    size_t words = x->n / 8 * 8;
    CUdeviceptr p = x->d;
    void *params[] = {&p, &words, &key};
    launch(XOR_KERNEL, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    for (size_t k = 0; k < words / 8; k++)
        ((uint64_t *)(void *)x->m)[k] ^= key; /* mirrors are malloc'd: 8-byte aligned */
}

static dtoh_fn dtoh;
static int verified;

static void verify(struct buf *b, size_t off, size_t len, const char *when)
{
    unsigned char *tmp = malloc(len ? len : 1);
    if (dtoh(tmp, b->d + off, len) != CUDA_SUCCESS) {
        printf("oversub FAIL pid=%d copy out failed (%s)\n", (int)getpid(), when);
        exit(1);
    }
    if (memcmp(tmp, b->m + off, len) != 0) {
        size_t i = 0;
        while (tmp[i] == b->m[off + i])
            i++;
        printf("oversub FAIL pid=%d mismatch %s at 0x%llx+%zu: device %02x mirror %02x\n", (int)getpid(), when,
               (unsigned long long)b->d, off + i, tmp[i], b->m[off + i]);
        exit(1);
    }
    free(tmp);
    verified++;
}

int main(int argc, char **argv)
{
    long nbufs = opt(argc, argv, "bufs", 4), size = opt(argc, argv, "size", 8 << 20);
    long nsmall = opt(argc, argv, "small", 16), iters = opt(argc, argv, "iters", 1000);
    long sleep_us = opt(argc, argv, "sleep_us", 0), verify_every = opt(argc, argv, "verify_every", 100);
    long capture_ms = opt(argc, argv, "capture_ms", 0), hold_ms = opt(argc, argv, "hold_ms", 0);
    long churn_thread = opt(argc, argv, "churn_thread", 0);
    long big = opt(argc, argv, "big", 0), idle_after_free_ms = opt(argc, argv, "idle_after_free_ms", 0);
    rng ^= (uint64_t)opt(argc, argv, "seed", 1) * 0x9e3779b97f4a7c15ull;
    int kind = PLAIN;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "alloc=async") == 0)
            kind = ASYNC;
        if (strcmp(argv[i], "alloc=vmm") == 0)
            kind = VMM;
    }

    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "oversub_client: %s\n", dlerror());
        return 2;
    }
    gpa = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    ((init_fn)dlsym(lib, "cuInit"))(0);
    CUcontext ctx;
    ((retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    alloc_fn alloc = (alloc_fn)sym("cuMemAlloc");
    pitch_fn pitch = (pitch_fn)sym("cuMemAllocPitch");
    free_fn mfree = (free_fn)sym("cuMemFree");
    htod = (htod_fn)sym("cuMemcpyHtoD");
    dtoh = (dtoh_fn)sym("cuMemcpyDtoH");
    dtod_fn dtod = (dtod_fn)sym("cuMemcpyDtoD");
    set8_fn set8 = (set8_fn)sym("cuMemsetD8");
    launch_fn launch = (launch_fn)sym("cuLaunchKernel");
    attr_fn attr = (attr_fn)sym("cuPointerGetAttribute");
    range_fn range = (range_fn)sym("cuMemGetAddressRange");
    info_fn info = (info_fn)sym("cuMemGetInfo");
    ipc_fn ipc = (ipc_fn)sym("cuIpcGetMemHandle");
    sync_fn sync = (sync_fn)dlsym(lib, "cuCtxSynchronize");
    resolve_alloc_kinds();

    int n = (int)(nbufs + nsmall + 1);
    struct buf *b = calloc((size_t)n, sizeof(*b));
    for (int i = 0; i < n; i++) {
        CUresult r;
        if (i < nbufs) {
            r = alloc_kind(&b[i], (size_t)size, kind, STREAM_A, alloc);
        } else if (i < n - 1) {
            r = alloc_kind(&b[i], 1 + rnd() % (96 << 10), kind == ASYNC ? ASYNC : PLAIN, STREAM_A, alloc);
        } else {
            size_t p = 0;
            r = pitch(&b[i].d, &p, 1000, 64, 4);
            b[i].n = p * 64;
        }
        if (r != CUDA_SUCCESS) {
            printf("oversub FAIL pid=%d allocation %d of %zu bytes: error %d\n", (int)getpid(), i, b[i].n, r);
            return 1;
        }
        b[i].m = malloc(b[i].n);
        fill(&b[i], 0, b[i].n);
    }
    long churned = 0;
    struct timespec ats;
    clock_gettime(CLOCK_MONOTONIC, &ats);
    printf("oversub allocated pid=%d buffers=%d allocated_ns=%llu\n", (int)getpid(), n,
           (unsigned long long)ats.tv_sec * 1000000000ull + (unsigned long long)ats.tv_nsec);
    fflush(stdout);

    if (capture_ms > 0) {
        begin_fn begin = (begin_fn)dlsym(lib, "cuStreamBeginCapture_v2");
        end_fn end = (end_fn)dlsym(lib, "cuStreamEndCapture");
        CUstream s = (CUstream)(uintptr_t)0x5000;
        begin(s, 0);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        printf("oversub capture_begin_ns=%llu\n", (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
        fflush(stdout);
        usleep((useconds_t)capture_ms * 1000);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        printf("oversub capture_end_ns=%llu\n", (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
        fflush(stdout);
        CUgraph g;
        end(s, &g);
    }

    unsigned char *tmp = malloc((size_t)(size > (96 << 10) ? size : (96 << 10)) + 65536);
    const char *until_file = NULL;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "until_file=", 11) == 0)
            until_file = argv[i] + 11;
    for (long it = 0; it < iters || (until_file != NULL && access(until_file, F_OK) != 0); it++) {
        struct buf *x = &b[rnd() % (uint64_t)n];
        size_t off = rnd() % x->n, len = 1 + rnd() % (x->n - off);
        switch (rnd() % (kind == PLAIN ? 5 : 6)) {
        case 0: /* copy in */
            for (size_t k = 0; k < len; k++)
                tmp[k] = (unsigned char)rnd();
            htod(x->d + off, tmp, len);
            memcpy(x->m + off, tmp, len);
            break;
        case 1: /* the asynchronous XOR kernel */
            xor_kernel(x, launch);
            break;
        case 2: { /* memset */
            unsigned char v = (unsigned char)rnd();
            set8(x->d + off, v, len);
            memset(x->m + off, v, len);
            break;
        }
        case 3: { /* device to device */
            struct buf *y = &b[rnd() % (uint64_t)n];
            size_t m = x->n < y->n ? x->n : y->n;
            size_t o = rnd() % m, l = 1 + rnd() % (m - o);
            if (x == y)
                break;
            dtod(x->d + o, y->d + o, l);
            memcpy(x->m + o, y->m + o, l);
            break;
        }
        case 5: /* churn: memory goes and comes back, as an allocator's would */
            if (x->kind == ASYNC && churn_thread) {
                pthread_t th;
                churn_ok = 0;
                pthread_create(&th, NULL, churn_main, x);
                pthread_join(th, NULL);
                if (!churn_ok) {
                    printf("oversub FAIL pid=%d free and allocate again on another thread\n", (int)getpid());
                    return 1;
                }
                fill(x, 0, x->n);
                churned++;
            } else if (x->kind == ASYNC) {
                /* freed in stream order on one stream, allocated again on the same or the other */
                CUstream s1 = rnd() % 2 ? STREAM_A : STREAM_B, s2 = rnd() % 2 ? STREAM_A : STREAM_B;
                if (freeasync(x->d, s1) != CUDA_SUCCESS || allocasync(&x->d, x->n, s2) != CUDA_SUCCESS) {
                    printf("oversub FAIL pid=%d stream-ordered free and allocate again\n", (int)getpid());
                    return 1;
                }
                fill(x, 0, x->n);
                churned++;
            } else if (x->kind == VMM) {
                /* shrink by the last segment, grow again with a new one; the buffer's last
                 * kernel may still be queued when it shrinks, as when PyTorch frees a block */
                size_t k = x->n / SEG - 1;
                xor_kernel(x, launch);
                CUresult r = vmm_unmap(x->d + k * SEG, SEG);
                if (r == CUDA_SUCCESS && x->h[k] != 0)
                    r = mrelease(x->h[k]);
                if (r == CUDA_SUCCESS)
                    r = vmm_segment(x, k);
                if (r != CUDA_SUCCESS) {
                    printf("oversub FAIL pid=%d unmap and map a segment again: error %d\n", (int)getpid(), r);
                    return 1;
                }
                fill(x, k * SEG, SEG);
                churned++;
            }
            break;
        default:
            verify(x, off, len, "in the loop");
        }
        if (verify_every > 0 && (it + 1) % verify_every == 0)
            for (int i = 0; i < n; i++)
                verify(&b[i], 0, b[i].n, "full check");
        if (sleep_us > 0)
            usleep((useconds_t)sleep_us);
    }
    for (int i = 0; i < n; i++)
        verify(&b[i], 0, b[i].n, "final check");

    /* What the driver says about the memory: as for a plain allocation. */
    CUdeviceptr base = 0, abase = 0;
    size_t rsize = 0, asize = 0;
    CUcontext actx = NULL;
    int small_i = nsmall > 0 ? (int)nbufs : 0;
    CUdeviceptr inner = b[small_i].d + b[small_i].n / 2;
    int range_ok = range(&base, &rsize, inner) == CUDA_SUCCESS && base == b[small_i].d && rsize == b[small_i].n &&
                   attr(&abase, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inner) == CUDA_SUCCESS && abase == base &&
                   attr(&asize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inner) == CUDA_SUCCESS && asize == rsize;
    int ctx_ok = attr(&actx, CU_POINTER_ATTRIBUTE_CONTEXT, b[0].d) == CUDA_SUCCESS && actx == ctx;
    size_t fr = 0, tot = 0;
    info(&fr, &tot);
    CUipcMemHandle h;
    CUresult ipc_r = ipc(&h, b[0].d);
    CUresult big_r = -1;
    if (big > 0) {
        CUdeviceptr d = 0;
        big_r = alloc(&d, (size_t)big);
        if (big_r == CUDA_SUCCESS)
            mfree(d);
    }
    /* The allocator-specific answers. */
    int kind_ok = 1;
    CUresult export_r = -1;
    if (kind == ASYNC) {
        CUmemoryPool pool;
        cuuint64_t used = 0, want = 0;
        ((pool_fn)sym("cuDeviceGetDefaultMemPool"))(&pool, 0);
        ((poolattr_fn)sym("cuMemPoolGetAttribute"))(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
        for (int i = 0; i < n; i++)
            want += b[i].kind == ASYNC ? b[i].n : 0;
        kind_ok = used == want;
        if (!kind_ok)
            printf("oversub pool used %llu, want %llu\n", (unsigned long long)used, (unsigned long long)want);
    } else if (kind == VMM) {
        /* the handle behind an address, its properties, the driver's range (the 2 MiB mapping), no export */
        CUmemGenericAllocationHandle h2 = 0;
        CUmemAllocationProp p2;
        CUdeviceptr vbase = 0;
        size_t vsize = 0;
        kind_ok = ((retain_h_fn)sym("cuMemRetainAllocationHandle"))(&h2, (void *)(uintptr_t)(b[0].d + SEG + 5)) ==
                      CUDA_SUCCESS &&
                  ((props_fn)sym("cuMemGetAllocationPropertiesFromHandle"))(&p2, h2) == CUDA_SUCCESS &&
                  p2.location.type == CU_MEM_LOCATION_TYPE_DEVICE && mrelease(h2) == CUDA_SUCCESS &&
                  range(&vbase, &vsize, b[0].d + SEG + 5) == CUDA_SUCCESS && vbase == b[0].d + SEG && vsize == SEG;
        int fd = -1;
        export_r = ((export_fn)sym("cuMemExportToShareableHandle"))(&fd, b[0].h[0], 1, 0);
    }
    long keep_freed = opt(argc, argv, "keep_freed", 0);
    for (int i = 0; i < keep_freed && i < n; i++) {
        if (free_kind(&b[i], STREAM_B, mfree) != CUDA_SUCCESS) {
            printf("oversub FAIL pid=%d free %d before the hold\n", (int)getpid(), i);
            return 1;
        }
        b[i].d = 0;
    }
    pthread_t trim;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "trim_file=", 10) == 0)
            trim_file = argv[i] + 10;
    if (trim_file != NULL)
        pthread_create(&trim, NULL, trim_main, NULL);
    printf("oversub done pid=%d verified=%d range_ok=%d ctx_ok=%d total=%zu ipc=%d big=%d kind_ok=%d churned=%ld "
           "export=%d\n",
           (int)getpid(), verified, range_ok, ctx_ok, tot, ipc_r, big_r, kind_ok, churned, export_r);
    fflush(stdout);
    if (hold_ms > 0)
        usleep((useconds_t)hold_ms * 1000);
    idle_until(argc, argv, "hold_until");
    if (trim_file != NULL)
        pthread_join(trim, NULL);
    if (opt(argc, argv, "recheck", 0)) {
        for (int i = 0; i < n; i++)
            if (b[i].d != 0)
                verify(&b[i], 0, b[i].n, "check after the hold");
        printf("oversub rechecked pid=%d\n", (int)getpid());
        fflush(stdout);
    }
    for (int i = 0; i < n; i++)
        if (b[i].d != 0 && free_kind(&b[i], STREAM_B, mfree) != CUDA_SUCCESS) {
            printf("oversub FAIL pid=%d free %d\n", (int)getpid(), i);
            return 1;
        }
    printf("oversub freed pid=%d\n", (int)getpid());
    fflush(stdout);
    if (idle_after_free_ms > 0)
        usleep((useconds_t)idle_after_free_ms * 1000);
    idle_until(argc, argv, "idle_until");
    if (kind == ASYNC) {
        /* what torch.cuda.empty_cache() does with cudaMallocAsync: the pool gives the memory back */
        CUmemoryPool pool;
        cuuint64_t left = 1;
        ((pool_fn)sym("cuDeviceGetDefaultMemPool"))(&pool, 0);
        sync();
        ((CUresult(*)(CUmemoryPool, size_t))sym("cuMemPoolTrimTo"))(pool, 0);
        ((poolattr_fn)sym("cuMemPoolGetAttribute"))(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &left);
        printf("oversub trimmed pool_reserved_after=%llu\n", (unsigned long long)left);
    }
    sync();
    return 0;
}
