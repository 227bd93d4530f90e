/*
 * The stub driver's memory: device memory is host memory, so test clients
 * can check every byte through cuMemcpy.
 *   cuMemAlloc_v2            anonymous mmap (a plain allocation) of the current device, which
 *                            cuPointerGetAttribute names (context, device ordinal)
 *   cuMemAddressReserve      mmap PROT_NONE: a range with nothing behind it
 *   cuMemCreate              pre-faulted anonymous pages: the "physical memory"
 *   cuMemMap / SetAccess     mremap of those pages onto the reserved range, read-write
 *   cuMemUnmap               pages moved out, PROT_NONE again: touching swapped-out memory faults.
 *                            Unmapping memory that queued or running work still uses aborts with a
 *                            line that names the work: on a GPU that work would fault
 *                            (CUDA_ERROR_ILLEGAL_ADDRESS, the context lost), since cuMemUnmap does
 *                            not wait for it; here the worker would fault later, at random
 *   cuMemAllocHost_v2        pre-faulted anonymous memory
 * Copies, memsets and the test kernel (f == STUB_XOR_KERNEL: params ptr, bytes,
 * key; XORs 64-bit words with key) run on the stub's worker in order, so a
 * swap that does not wait for queued work reads stale bytes or faults.
 *
 *   GPUSHARE_STUB_MEMTRACE   file: "M <pid> <ns> <+bytes|-bytes>" per cuMemCreate / cuMemRelease
 *                            (logged before creating and after releasing: an upper bound of
 *                            physical residency over time, across processes)
 *                            and "P <pid> <ns> <+bytes>" per asynchronous copy whose host side is not
 *                            page-locked (cuMemHostRegister), which a GPU runs at a fraction of the rate,
 *                            and "D <pid> <ns> <+bytes>" when the worker has done an asynchronous copy to the host
 *   GPUSHARE_STUB_REGISTER_US   every cuMemHostRegister takes this long (a host slow to page-lock)
 *   GPUSHARE_STUB_REGISTER_UNTIL every cuMemHostRegister waits until this file exists (at most 60 s)
 *   GPUSHARE_STUB_HOST_LIMIT bytes of page-locked host memory (cuMemAllocHost, cuMemHostRegister)
 *                            before they fail (default: none)
 *   GPUSHARE_STUB_REGISTER_MAX  cuMemHostRegister of more bytes than this at once fails (default: none)
 *   GPUSHARE_STUB_MEM_TOTAL  what cuMemGetInfo reports as total (default 80 GiB)
 *   GPUSHARE_STUB_ALLOC_NOMAP=1  cuMemAlloc hands out addresses with no memory behind them and cuMemFree
 *                            frees nothing (benchmarks of the shim's own cost per allocation)
 *   GPUSHARE_STUB_FULL_FILE  while this file exists, cuMemCreate fails with out of memory (the device is
 *                            full: another process holds it)
 *   GPUSHARE_STUB_RETAIN_NEW=1  cuMemRetainAllocationHandle gives a new handle value (holding one reference
 *                            of the allocation) instead of the allocation's own
 *   GPUSHARE_STUB_HOLD_DIR   directory: the file <pid> says what the process holds per device, as NVML's
 *                            per-process figure would, one line "<device> <bytes>" per device it holds
 *                            anything on: its plain allocations plus GPUSHARE_STUB_CTX_BYTES (default 0)
 *                            once it made a context there; rewritten whole (rename) on each change
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define STUB_EXPORT __attribute__((visibility("default")))
#define STUB_XOR_KERNEL ((CUfunction)(uintptr_t)0x5eed)
#define GRAN (2u << 20)

CUresult stub_enqueue(const char *name, void (*fn)(uint64_t *), uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3,
                      int wait);
void stub_drain(void);
const char *stub_inflight_at(uint64_t lo, uint64_t hi);
/* stub_capture.c: the real driver's refusals during stream capture */
CUresult stub_capture_unsafe(const char *name);
CUresult stub_capture_conflict(const char *name, CUstream s, int any);
int stub_capture_record(CUstream s, const char *name, void (*fn)(uint64_t *), uint64_t a0, uint64_t a1, uint64_t a2,
                        uint64_t a3);
#define UNSAFE(name)                                                                               \
    do {                                                                                           \
        CUresult refused_ = stub_capture_unsafe(name);                                             \
        if (refused_ != CUDA_SUCCESS)                                                              \
            return refused_;                                                                       \
    } while (0)
/* the legacy stream (NULL, CU_STREAM_LEGACY) synchronizes with every blocking stream, capturing ones too */
#define LEGACY(s) ((s) == NULL || (uintptr_t)(s) == 1)

static pthread_mutex_t vmu = PTHREAD_MUTEX_INITIALIZER;
static atomic_llong host_used;

static long long env_ll(const char *n, long long def)
{
    const char *v = getenv(n);
    return v && *v ? atoll(v) : def;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* kind 'M': physical memory created (+) or released (-); 'P': an asynchronous copy of delta bytes
 * to or from host memory that is not page-locked (on a GPU: a copy at a fraction of the pinned rate) */
static void memtrace(char kind, long long delta)
{
    static int fd = -2;
    if (fd == -2) {
        const char *t = getenv("GPUSHARE_STUB_MEMTRACE");
        fd = t && *t ? open(t, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    }
    if (fd < 0)
        return;
    char line[96];
    int n = snprintf(line, sizeof(line), "%c %d %llu %+lld\n", kind, (int)getpid(), (unsigned long long)now_ns(), delta);
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
}

/* ---- the holdings file (GPUSHARE_STUB_HOLD_DIR) ---- */
#define HOLD_DEVS 16
static long long held[HOLD_DEVS];
static int has_ctx[HOLD_DEVS];

/* Rewrites the holdings file; called with vmu held. */
static void hold_write_locked(void)
{
    const char *dir = getenv("GPUSHARE_STUB_HOLD_DIR");
    if (dir == NULL || *dir == 0)
        return;
    long long ctx_bytes = env_ll("GPUSHARE_STUB_CTX_BYTES", 0);
    char tmp[512], path[512], buf[HOLD_DEVS * 32];
    int n = 0;
    for (int d = 0; d < HOLD_DEVS; d++) {
        long long b = held[d] + (has_ctx[d] ? ctx_bytes : 0);
        if (b > 0 || has_ctx[d])
            n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%d %lld\n", d, b);
    }
    snprintf(tmp, sizeof(tmp), "%s/.%d.tmp", dir, (int)getpid());
    snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, buf, (size_t)n);
    (void)w;
    close(fd);
    rename(tmp, path);
}

__attribute__((visibility("hidden"))) void stub_hold_context(int dev);
__attribute__((visibility("hidden"))) void stub_hold_context(int dev)
{
    if (dev < 0 || dev >= HOLD_DEVS)
        return;
    pthread_mutex_lock(&vmu);
    if (!has_ctx[dev]) {
        has_ctx[dev] = 1;
        hold_write_locked();
    }
    pthread_mutex_unlock(&vmu);
}

/* ---- plain allocations ---- */
#define MAXPLAIN 4096
static struct {
    CUdeviceptr p;
    size_t n;
    int dev; /* the device current at the allocation, which holds it */
} plain[MAXPLAIN];

__attribute__((visibility("hidden"))) int stub_cur_dev(void);

static CUresult plain_alloc(CUdeviceptr *dptr, size_t n);
static CUresult plain_free(CUdeviceptr d);

STUB_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n)
{
    UNSAFE("cuMemAlloc_v2");
    return plain_alloc(dptr, n);
}

static int nomap(void)
{
    static atomic_int v = -1;
    int x = atomic_load(&v);
    if (x < 0)
        atomic_store(&v, x = env_ll("GPUSHARE_STUB_ALLOC_NOMAP", 0) == 1);
    return x;
}

static CUresult plain_alloc(CUdeviceptr *dptr, size_t n)
{
    if (nomap()) {
        static _Atomic CUdeviceptr next = 0x7e0000000000ull;
        if (n == 0)
            return CUDA_ERROR_INVALID_VALUE;
        *dptr = atomic_fetch_add(&next, (n + 4095) / 4096 * 4096);
        return CUDA_SUCCESS;
    }
    stub_enqueue("cuMemAlloc_v2", NULL, 0, 0, 0, 0, 0);
    if (n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXPLAIN; i++)
        if (plain[i].p == 0) {
            plain[i].p = (CUdeviceptr)(uintptr_t)p;
            plain[i].n = n;
            plain[i].dev = stub_cur_dev();
            if (plain[i].dev >= 0 && plain[i].dev < HOLD_DEVS)
                held[plain[i].dev] += (long long)n;
            hold_write_locked();
            break;
        }
    pthread_mutex_unlock(&vmu);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    (void)elem;
    *pitch = (w + 511) / 512 * 512;
    return cuMemAlloc_v2(dptr, *pitch * h);
}

/* Managed memory: host memory like the rest. */
STUB_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags)
{
    (void)flags;
    UNSAFE("cuMemAllocManaged");
    return plain_alloc(dptr, n);
}

STUB_EXPORT CUresult cuMemFree_v2(CUdeviceptr d)
{
    UNSAFE("cuMemFree_v2");
    return plain_free(d);
}

static CUresult plain_free(CUdeviceptr d)
{
    if (nomap())
        return CUDA_SUCCESS;
    stub_enqueue("cuMemFree_v2", NULL, 0, 0, 0, 0, 0);
    stub_drain();
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXPLAIN; i++)
        if (plain[i].p == d && d != 0) {
            munmap((void *)(uintptr_t)d, plain[i].n);
            plain[i].p = 0;
            if (plain[i].dev >= 0 && plain[i].dev < HOLD_DEVS)
                held[plain[i].dev] -= (long long)plain[i].n;
            hold_write_locked();
            pthread_mutex_unlock(&vmu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&vmu);
    return CUDA_ERROR_INVALID_VALUE;
}

static int plain_range_dev(CUdeviceptr d, CUdeviceptr *base, size_t *size, int *dev)
{
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXPLAIN; i++)
        if (plain[i].p != 0 && d >= plain[i].p && d < plain[i].p + plain[i].n) {
            *base = plain[i].p;
            *size = plain[i].n;
            *dev = plain[i].dev;
            pthread_mutex_unlock(&vmu);
            return 1;
        }
    pthread_mutex_unlock(&vmu);
    return 0;
}

static int plain_range(CUdeviceptr d, CUdeviceptr *base, size_t *size)
{
    int dev;
    return plain_range_dev(d, base, size, &dev);
}

/* ---- the VMM API ---- */
/* A physical allocation is an anonymous, pre-faulted buffer; mapping moves its
 * pages to the reserved address (mremap), unmapping moves them out again.
 * (memfd pages would be the obvious model, but first writes to shared memory
 * are slow in the VMs CI runs in.) */
struct phys {
    void *at; /* where the pages are while unmapped */
    size_t size;
    CUdeviceptr mapped; /* 0 when not mapped */
    int refs;           /* cuMemCreate and cuMemRetainAllocationHandle, less cuMemRelease */
    int dev;            /* the device its properties named */
    struct phys *of;    /* an imported handle: the allocation it names (holding one reference of it) */
};

/* The allocation a handle names: itself, or for an imported handle the one it was exported from. */
static struct phys *phys_of(CUmemGenericAllocationHandle h)
{
    struct phys *ph = (struct phys *)(uintptr_t)h;
    return ph != NULL && ph->of != NULL ? ph->of : ph;
}
#define MAXMAP 4096
static struct phys *maps[MAXMAP]; /* mapped handles, looked up by address on unmap */

STUB_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
    (void)prop;
    (void)option;
    *g = GRAN;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                         unsigned long long flags)
{
    UNSAFE("cuMemAddressReserve");
    (void)addr;
    (void)flags;
    if (align < GRAN)
        align = GRAN;
    size_t span = size + align;
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t a = ((uintptr_t)p + align - 1) / align * align;
    if (a > (uintptr_t)p)
        munmap(p, a - (uintptr_t)p);
    size_t tail = (uintptr_t)p + span - (a + size);
    if (tail)
        munmap((void *)(a + size), tail);
    *ptr = (CUdeviceptr)a;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    UNSAFE("cuMemAddressFree");
    return munmap((void *)(uintptr_t)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STUB_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
    UNSAFE("cuMemCreate");
    (void)flags;
    stub_enqueue("cuMemCreate", NULL, 0, 0, 0, 0, 0);
    if (size == 0 || size % GRAN)
        return CUDA_ERROR_INVALID_VALUE;
    const char *full = getenv("GPUSHARE_STUB_FULL_FILE");
    if (full != NULL && *full != '\0' && access(full, F_OK) == 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* "another process holds the rest of the device" */
    memtrace('M', (long long)size);
    void *at = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    struct phys *ph = at == MAP_FAILED ? NULL : malloc(sizeof(*ph));
    if (ph == NULL) {
        if (at != MAP_FAILED)
            munmap(at, size);
        memtrace('M', -(long long)size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ph = (struct phys){.at = at, .size = size, .refs = 1, .dev = prop != NULL ? prop->location.id : 0};
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    UNSAFE("cuMemRelease");
    struct phys *ph = (struct phys *)(uintptr_t)h;
    if (ph == NULL || ph->refs <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ph->of != NULL) {
        /* an imported handle: its last release lets go of the allocation it holds */
        if (--ph->refs > 0)
            return CUDA_SUCCESS;
        struct phys *of = ph->of;
        free(ph);
        return cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)of);
    }
    if (--ph->refs > 0 || ph->mapped)
        return CUDA_SUCCESS; /* like the driver: the memory goes with the last reference and unmap */
    size_t size = ph->size;
    munmap(ph->at, size);
    free(ph);
    memtrace('M', -(long long)size);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                              unsigned long long flags)
{
    UNSAFE("cuMemMap");
    (void)flags;
    struct phys *ph = phys_of(h);
    if (ph == NULL || offset != 0 || size != ph->size || ph->mapped)
        return CUDA_ERROR_INVALID_VALUE;
    if (mremap(ph->at, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)ptr) == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXMAP; i++)
        if (maps[i] == NULL) {
            maps[i] = ph;
            break;
        }
    pthread_mutex_unlock(&vmu);
    ph->at = NULL;
    ph->mapped = ptr;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    UNSAFE("cuMemSetAccess");
    (void)desc;
    (void)count;
    return mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS
                                                                               : CUDA_ERROR_INVALID_VALUE;
}

static CUresult unmap_one(CUdeviceptr ptr, size_t *size)
{
    struct phys *ph = NULL;
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXMAP; i++)
        if (maps[i] != NULL && maps[i]->mapped == ptr && maps[i]->size <= *size) {
            ph = maps[i];
            maps[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&vmu);
    if (ph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *size = ph->size;
    void *at = (void *)(uintptr_t)ptr;
    void *scratch = mmap(NULL, ph->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (scratch == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The range never has a hole: it is PROT_NONE before the pages leave, and MREMAP_DONTUNMAP
     * leaves it mapped (empty), so no other thread's mmap can land there and be overwritten by
     * the next cuMemMap. Kernels before 5.7 lack it: move, then reserve again at once. */
    mprotect(at, ph->size, PROT_NONE);
    if (mremap(at, ph->size, ph->size, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, scratch) == MAP_FAILED) {
        if (mremap(at, ph->size, ph->size, MREMAP_MAYMOVE | MREMAP_FIXED, scratch) == MAP_FAILED) {
            mprotect(at, ph->size, PROT_READ | PROT_WRITE);
            munmap(scratch, ph->size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        mmap(at, ph->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    }
    mprotect(scratch, ph->size, PROT_READ | PROT_WRITE);
    ph->at = scratch;
    ph->mapped = 0;
    if (ph->refs == 0) {
        ph->refs = 1;
        return cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)ph);
    }
    return CUDA_SUCCESS;
}

/* The pages move out to a scratch area; the address range is reserved (PROT_NONE) again.
 * The range is one or more whole mappings, back to back. */
STUB_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    UNSAFE("cuMemUnmap");
    const char *busy = stub_inflight_at(ptr, ptr + size);
    if (busy != NULL) {
        /* Deterministic where the worker's fault would be timing-dependent: whoever unmaps
         * (the application or the shim) must have waited for its work first. */
        fprintf(stderr, "stub driver: cuMemUnmap(0x%llx, %zu) while queued work (%s) still uses it: "
                        "the caller did not wait for its work first\n", (unsigned long long)ptr, size, busy);
        abort();
    }
    while (size > 0) {
        size_t n = size;
        CUresult e = unmap_one(ptr, &n);
        if (e != CUDA_SUCCESS)
            return e;
        ptr += n;
        size -= n;
    }
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size);
STUB_EXPORT CUresult cuMemFreeHost(void *p);
STUB_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags);
STUB_EXPORT CUresult cuMemHostUnregister(void *p);
STUB_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
    UNSAFE("cuMemAllocHost_v2");
    long long limit = env_ll("GPUSHARE_STUB_HOST_LIMIT", -1);
    if (limit >= 0 && atomic_load(&host_used) + (long long)size > limit)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* pinned memory is resident from the start */
    char *p = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_fetch_add(&host_used, (long long)size);
    *(size_t *)p = size;
    *pp = p + 4096;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemFreeHost(void *p)
{
    UNSAFE("cuMemFreeHost");
    if (p == NULL)
        return CUDA_SUCCESS;
    char *base = (char *)p - 4096;
    size_t size = *(size_t *)base;
    atomic_fetch_sub(&host_used, (long long)size);
    munmap(base, size + 4096);
    return CUDA_SUCCESS;
}

/* Page-locking existing memory: counts against GPUSHARE_STUB_HOST_LIMIT too. */
#define MAXREG 4096
static struct {
    void *p;
    size_t n;
} registered[MAXREG];

STUB_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    UNSAFE("cuMemHostRegister_v2");
    (void)flags;
    long long limit = env_ll("GPUSHARE_STUB_HOST_LIMIT", -1);
    if (limit >= 0 && atomic_load(&host_used) + (long long)size > limit)
        return CUDA_ERROR_OUT_OF_MEMORY;
    long long most = env_ll("GPUSHARE_STUB_REGISTER_MAX", -1);
    if (most >= 0 && (long long)size > most)
        return CUDA_ERROR_INVALID_VALUE;
    long long us = env_ll("GPUSHARE_STUB_REGISTER_US", 0);
    if (us > 0)
        usleep((useconds_t)us);
    /* Held until the test has seen a swap wait for this staging (bounded: a test that never opens the
     * gate gets its registrations after 60 s, not a hung client). */
    const char *until = getenv("GPUSHARE_STUB_REGISTER_UNTIL");
    for (int i = 0; until != NULL && *until != '\0' && access(until, F_OK) != 0 && i < 60000; i++)
        usleep(1000);
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXREG; i++)
        if (registered[i].p == NULL) {
            registered[i].p = p;
            registered[i].n = size;
            break;
        }
    pthread_mutex_unlock(&vmu);
    atomic_fetch_add(&host_used, (long long)size);
    return CUDA_SUCCESS;
}

/* Whether [p, p+n) lies in one page-locked range. */
static int registered_covers(const void *p, size_t n)
{
    const char *c = p;
    int yes = 0;
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXREG && !yes; i++)
        yes = registered[i].p != NULL && c >= (char *)registered[i].p &&
              c + n <= (char *)registered[i].p + registered[i].n;
    pthread_mutex_unlock(&vmu);
    return yes;
}

STUB_EXPORT CUresult cuMemHostUnregister(void *p)
{
    UNSAFE("cuMemHostUnregister");
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXREG; i++)
        if (registered[i].p == p && p != NULL) {
            atomic_fetch_sub(&host_used, (long long)registered[i].n);
            registered[i].p = NULL;
            pthread_mutex_unlock(&vmu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&vmu);
    return CUDA_ERROR_INVALID_VALUE;
}

STUB_EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    *dev = stub_cur_dev();
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    (void)flags;
    static atomic_uintptr_t next = 0x7000;
    *s = (CUstream)(atomic_fetch_add(&next, 0x10) | (uintptr_t)stub_cur_dev());
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    if (stub_capture_conflict("cuStreamSynchronize", s, LEGACY(s)) != CUDA_SUCCESS)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    UNSAFE("cuStreamSynchronize");
    stub_drain();
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    UNSAFE("cuMemGetInfo_v2");
    /* GPUSHARE_STUB_MEM_TOTAL_<d> for device d, else GPUSHARE_STUB_MEM_TOTAL */
    char name[64];
    snprintf(name, sizeof(name), "GPUSHARE_STUB_MEM_TOTAL_%d", stub_cur_dev());
    *total = (size_t)env_ll(name, env_ll("GPUSHARE_STUB_MEM_TOTAL", 80ll << 30));
    *free_ = *total;
    return CUDA_SUCCESS;
}

/* Like the real driver on VMM memory: no context, the range is the whole mapping. */
STUB_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    CUdeviceptr base;
    size_t size;
    int dev;
    if (!plain_range_dev(p, &base, &size, &dev))
        return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = (CUcontext)(uintptr_t)(0x1000 + 0x100 * dev);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

STUB_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
    for (unsigned int i = 0; i < n; i++)
        if (data[i])
            cuPointerGetAttribute(data[i], attrs[i], p);
    return CUDA_SUCCESS;
}

/* The handle mapped at d, if any. */
static struct phys *mapped_at(CUdeviceptr d)
{
    struct phys *ph = NULL;
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXMAP && ph == NULL; i++)
        if (maps[i] != NULL && d >= maps[i]->mapped && d < maps[i]->mapped + maps[i]->size)
            ph = maps[i];
    pthread_mutex_unlock(&vmu);
    return ph;
}

STUB_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr d)
{
    CUdeviceptr base;
    size_t size;
    struct phys *ph = mapped_at(d);
    if (ph != NULL) {
        base = ph->mapped; /* VMM memory: the driver's range is the mapping */
        size = ph->size;
    } else if (!plain_range(d, &base, &size)) {
        return CUDA_ERROR_NOT_FOUND;
    }
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr d)
{
    CUdeviceptr base;
    size_t size;
    if (!plain_range(d, &base, &size))
        return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &base, sizeof(base));
    return CUDA_SUCCESS;
}

/* ---- work that moves bytes ---- */
static void op_copy(uint64_t *a)
{
    memmove((void *)(uintptr_t)a[0], (const void *)(uintptr_t)a[1], (size_t)a[2]);
}

/* an asynchronous copy to the host: logged when the worker has done it */
static void op_copy_out(uint64_t *a)
{
    memmove((void *)(uintptr_t)a[0], (const void *)(uintptr_t)a[1], (size_t)a[2]);
    memtrace('D', (long long)a[2]);
}

static void op_set8(uint64_t *a)
{
    memset((void *)(uintptr_t)a[0], (int)a[1], (size_t)a[2]);
}

static void op_set32(uint64_t *a)
{
    uint32_t *p = (uint32_t *)(uintptr_t)a[0];
    for (size_t i = 0; i < (size_t)a[2]; i++)
        p[i] = (uint32_t)a[1];
}

static void op_xor(uint64_t *a)
{
    uint64_t *p = (uint64_t *)(uintptr_t)a[0];
    for (size_t i = 0; i < (size_t)a[1] / 8; i++)
        p[i] ^= a[2];
}

#define COPY(name, dstT, srcT, wait)                                                               \
    STUB_EXPORT CUresult name(dstT dst, srcT src, size_t n);                                       \
    STUB_EXPORT CUresult name(dstT dst, srcT src, size_t n)                                        \
    {                                                                                              \
        if (stub_capture_conflict(#name, NULL, 1) != CUDA_SUCCESS) /* the legacy stream */         \
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;                                             \
        return stub_enqueue(#name, op_copy, (uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n, 0, wait); \
    }
#define COPYA(name, dstT, srcT, host, op)                                                          \
    STUB_EXPORT CUresult name(dstT dst, srcT src, size_t n, CUstream s);                           \
    STUB_EXPORT CUresult name(dstT dst, srcT src, size_t n, CUstream s)                            \
    {                                                                                              \
        if (stub_capture_record(s, #name, op, (uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n, 0)) \
            return CUDA_SUCCESS;                                                                   \
        if (LEGACY(s) && stub_capture_conflict(#name, NULL, 1) != CUDA_SUCCESS)                   \
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;                                             \
        UNSAFE(#name); /* a copy outside the captured stream */                                   \
        if (host != NULL && !registered_covers(host, n))                                          \
            memtrace('P', (long long)n);                                                           \
        return stub_enqueue(#name, op, (uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n, 0, 0); \
    }
COPY(cuMemcpyHtoD_v2, CUdeviceptr, const void *, 1)
COPY(cuMemcpyDtoH_v2, void *, CUdeviceptr, 1)
COPY(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr, 1)
/* a peer copy: device memory is host memory, whichever GPU each side is on */
STUB_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n);
STUB_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n)
{
    (void)dctx, (void)sctx;
    if (stub_capture_conflict("cuMemcpyPeer", NULL, 1) != CUDA_SUCCESS)
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return stub_enqueue("cuMemcpyPeer", op_copy, dst, src, n, 0, 1);
}
COPYA(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *, (const void *)src, op_copy)
COPYA(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr, (const void *)dst, op_copy_out)
COPYA(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, (const void *)NULL, op_copy)

STUB_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    if (stub_capture_conflict("cuMemsetD8_v2", NULL, 1) != CUDA_SUCCESS)
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return stub_enqueue("cuMemsetD8_v2", op_set8, d, v, n, 0, 1);
}

STUB_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n)
{
    if (stub_capture_conflict("cuMemsetD32_v2", NULL, 1) != CUDA_SUCCESS)
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return stub_enqueue("cuMemsetD32_v2", op_set32, d, v, n, 0, 1);
}

STUB_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
    if (f == STUB_XOR_KERNEL && params != NULL &&
        stub_capture_record(s, "cuLaunchKernel", op_xor, *(CUdeviceptr *)params[0], *(size_t *)params[1],
                            *(uint64_t *)params[2], 0))
        return CUDA_SUCCESS;
    if (f == STUB_XOR_KERNEL && params != NULL)
        return stub_enqueue("cuLaunchKernel", op_xor, *(CUdeviceptr *)params[0], *(size_t *)params[1],
                            *(uint64_t *)params[2], 0, 0);
    if (stub_capture_record(s, "cuLaunchKernel", NULL, 0, 0, 0, 0))
        return CUDA_SUCCESS; /* any other kernel on a capturing stream: a node of the graph, busy time at replay */
    return stub_enqueue("cuLaunchKernel", NULL, 0, 0, 0, 0, 0);
}

/* ---- stream-ordered allocation (the driver's, when the shim passes it through) ---- */
#define STUB_DEFAULT_POOL ((CUmemoryPool)(uintptr_t)0x9000)

STUB_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    (void)s; /* legal during capture (a graph memory node on a GPU) */
    return plain_alloc(dptr, n);
}

STUB_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    return cuMemAllocAsync(dptr, n, s);
}

STUB_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    (void)pool;
    return cuMemAllocAsync(dptr, n, s);
}

STUB_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    return cuMemAllocFromPoolAsync(dptr, n, pool, s);
}

STUB_EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s)
{
    (void)s;
    return plain_free(d);
}

STUB_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s)
{
    return cuMemFreeAsync(d, s);
}

STUB_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    (void)dev;
    *pool = STUB_DEFAULT_POOL;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    /* GPUSHARE_STUB_CUSTOM_POOL=1: the application made its own pool the device's current one */
    *pool = env_ll("GPUSHARE_STUB_CUSTOM_POOL", 0) ? (CUmemoryPool)(uintptr_t)0x9100 : STUB_DEFAULT_POOL;
    (void)dev;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    (void)pool;
    (void)keep;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    (void)pool;
    (void)attr;
    *(cuuint64_t *)value = 0; /* the stub's pool never holds anything */
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    (void)pool;
    (void)attr;
    (void)value;
    return CUDA_SUCCESS;
}

/* ---- the rest of the VMM API an application uses on its own handles ---- */
STUB_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    (void)location;
    if (mapped_at(ptr) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
}

/* With GPUSHARE_STUB_RETAIN_NEW=1 the retained handle is a new value holding one reference of the
 * allocation, as an imported one is (a driver may answer either way). */
STUB_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    struct phys *ph = mapped_at((CUdeviceptr)(uintptr_t)addr);
    if (ph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (env_ll("GPUSHARE_STUB_RETAIN_NEW", 0) == 1) {
        struct phys *n = calloc(1, sizeof(*n));
        if (n == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        *n = (struct phys){.size = ph->size, .refs = 1, .dev = ph->dev, .of = ph};
        ph->refs++;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)n;
        return CUDA_SUCCESS;
    }
    ph->refs++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
    struct phys *ph = phys_of(h);
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = ph != NULL ? ph->dev : 0;
    return CUDA_SUCCESS;
}

/* A POSIX file descriptor (of /dev/null) per export, remembered with the allocation it names; an import
 * is a new handle, as the driver's is, holding one reference of that allocation. */
#define MAXEXPORT 256
static struct {
    int fd;
    struct phys *ph;
} exported[MAXEXPORT];

STUB_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
                                                  unsigned long long flags)
{
    (void)flags;
    struct phys *ph = phys_of(h);
    if (shareable == NULL || ph == NULL || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vmu);
    int i;
    for (i = 0; i < MAXEXPORT && exported[i].ph != NULL; i++)
        ;
    if (i < MAXEXPORT)
        exported[i].fd = fd, exported[i].ph = ph;
    pthread_mutex_unlock(&vmu);
    if (i == MAXEXPORT) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                    CUmemAllocationHandleType type)
{
    if (handle == NULL || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)(intptr_t)os_handle;
    struct phys *of = NULL;
    pthread_mutex_lock(&vmu);
    for (int i = 0; i < MAXEXPORT && of == NULL; i++)
        if (exported[i].ph != NULL && exported[i].fd == fd)
            of = exported[i].ph;
    struct phys *ph = of != NULL ? calloc(1, sizeof(*ph)) : NULL;
    if (ph != NULL) {
        of->refs++;
        *ph = (struct phys){.size = of->size, .refs = 1, .dev = of->dev, .of = of};
    }
    pthread_mutex_unlock(&vmu);
    if (ph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

/* ---- context limits and arrays: accepted, with no memory behind them ---- */
STUB_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    (void)limit, (void)value;
    return CUDA_SUCCESS;
}

static CUresult new_array(void **out)
{
    void *a = malloc(16);
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = a;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    if (arr == NULL || desc == NULL || desc->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return new_array((void **)arr);
}

STUB_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    if (arr == NULL || desc == NULL || desc->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return new_array((void **)arr);
}

STUB_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
    if (arr == NULL || desc == NULL || desc->Width == 0 || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return new_array((void **)arr);
}

STUB_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    free(arr);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    free(arr);
    return CUDA_SUCCESS;
}

/* For tests only: a device handle made where the shim cannot see (as one imported from another process
 * would be), to check what the shim does with handles it does not know. */
STUB_EXPORT CUresult gsStubMemCreateUnseen(CUmemGenericAllocationHandle *h, size_t size);
STUB_EXPORT CUresult gsStubMemCreateUnseen(CUmemGenericAllocationHandle *h, size_t size)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    return cuMemCreate(h, size, &prop, 0);
}
