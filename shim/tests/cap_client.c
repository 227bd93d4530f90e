/*
 * The memory limit's test application, on the stub driver. Run with GPUSHARE_MEMORY_LIMIT_BYTES=L.
 *
 *   cap_client PATH L
 *     PATH  alloc | pitch | managed | async | pool | vmm: the allocation path under test
 *     L     the limit the test set (to size the allocations: four of L/4 fill it exactly)
 *
 * Allocates four blocks of L/4 through PATH, then one more through PATH and one of 1 MiB with
 * cuMemAlloc (both must fail: the limit is full, and counted by the bytes the driver takes), frees
 * one block, allocates it again (must succeed), frees everything and checks cuMemGetInfo along the
 * way. Prints one line:
 *   cap PATH fill=<results> over=<result> over_small=<result> again=<result> total=T free_full=F free_empty=E
 * where results are CUresult numbers (0 success, 2 out of memory). Without a limit set it prints the
 * same line with what the driver answered.
 *
 *   cap_client retain L   a cuMemCreate handle of L/2, mapped, retained through its address
 *                         (cuMemRetainAllocationHandle) and released twice; after each release, an
 *                         allocation of L/2 + 1 MiB. Prints "cap retain first=R second=R": the
 *                         allocation must fail while the retained handle still holds its pages (2)
 *                         and succeed once the last release gave them back (0)
 *   cap_client mmap L     vectorAddMMAP's pattern (see mmap_pattern)
 *   cap_client threads L  8 threads allocate 1 MiB blocks with cuMemAlloc until refused, then free them
 *                         all. Prints "cap threads got=N free_after=F": N must be L / 1 MiB exactly
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "resolve.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*freeasync_fn)(CUdeviceptr, CUstream);
typedef CUresult (*defpool_fn)(CUmemoryPool *, CUdevice);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*retainh_fn)(CUmemGenericAllocationHandle *, void *);


static const char *path;
static size_t unit;
static CUmemoryPool pool;

/* One allocation of unit bytes (as the driver takes them) through the path under test. */
static CUresult take(unsigned long long *key)
{
    CUdeviceptr d = 0;
    CUresult r;
    if (!strcmp(path, "alloc")) {
        r = ((alloc_fn)sym("cuMemAlloc"))(&d, unit);
    } else if (!strcmp(path, "pitch")) {
        /* 1000 bytes wide: the pitch is 1024, so pitch * height is unit, width * height less */
        size_t pitch = 0;
        r = ((pitch_fn)sym("cuMemAllocPitch"))(&d, &pitch, 1000, unit / 1024, 4);
        if (r == CUDA_SUCCESS && pitch != 1024) {
            fprintf(stderr, "cap_client: pitch %zu\n", pitch);
            exit(1);
        }
    } else if (!strcmp(path, "managed")) {
        r = ((managed_fn)sym("cuMemAllocManaged"))(&d, unit, 1 /* CU_MEM_ATTACH_GLOBAL */);
    } else if (!strcmp(path, "async")) {
        r = ((async_fn)sym("cuMemAllocAsync"))(&d, unit, NULL);
    } else if (!strcmp(path, "pool")) {
        r = ((pool_fn)sym("cuMemAllocFromPoolAsync"))(&d, unit, pool, NULL);
    } else {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle h = 0;
        r = ((create_fn)sym("cuMemCreate"))(&h, unit, &prop, 0);
        d = h;
    }
    *key = r == CUDA_SUCCESS ? d : 0;
    return r;
}

static CUresult give(unsigned long long key)
{
    if (!strcmp(path, "async") || !strcmp(path, "pool"))
        return ((freeasync_fn)sym("cuMemFreeAsync"))(key, NULL);
    if (!strcmp(path, "vmm"))
        return ((release_fn)sym("cuMemRelease"))(key);
    return ((free_fn)sym("cuMemFree"))(key);
}

static CUresult retained(size_t lim)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr va = 0, probe = 0;
    if (((create_fn)sym("cuMemCreate"))(&h, lim / 2, &prop, 0) != CUDA_SUCCESS ||
        ((reserve_fn)sym("cuMemAddressReserve"))(&va, lim / 2, 0, 0, 0) != CUDA_SUCCESS ||
        ((map_fn)sym("cuMemMap"))(va, lim / 2, 0, h, 0) != CUDA_SUCCESS ||
        ((retainh_fn)sym("cuMemRetainAllocationHandle"))(&h2, (void *)(uintptr_t)va) != CUDA_SUCCESS) {
        fprintf(stderr, "cap_client: cannot set up the retained handle\n");
        exit(1);
    }
    alloc_fn alloc = (alloc_fn)sym("cuMemAlloc");
    ((release_fn)sym("cuMemRelease"))(h);
    CUresult first = alloc(&probe, lim / 2 + (1 << 20));
    if (first == CUDA_SUCCESS)
        ((free_fn)sym("cuMemFree"))(probe);
    ((unmap_fn)sym("cuMemUnmap"))(va, lim / 2);
    ((release_fn)sym("cuMemRelease"))(h2);
    CUresult second = alloc(&probe, lim / 2 + (1 << 20));
    printf("cap retain first=%d second=%d\n", first, second);
    return CUDA_SUCCESS;
}

/* vectorAddMMAP's pattern: each handle of L/4 is created, mapped and released at once, so only its
 * mapping holds it; then more of the same, until refused. Then everything is unmapped and one more is
 * created. Prints "cap mmap mapped=N again=R": N must be 4 (the mappings hold the limit) and R 0. */
static int mmap_pattern(size_t lim)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUdeviceptr va = 0;
    size_t piece = lim / 4, most = 12;
    if (((reserve_fn)sym("cuMemAddressReserve"))(&va, piece * most, 0, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "cap_client: cannot reserve\n");
        return 1;
    }
    int mapped = 0;
    for (size_t i = 0; i < most; i++) {
        CUmemGenericAllocationHandle h = 0;
        if (((create_fn)sym("cuMemCreate"))(&h, piece, &prop, 0) != CUDA_SUCCESS)
            break;
        if (((map_fn)sym("cuMemMap"))(va + i * piece, piece, 0, h, 0) != CUDA_SUCCESS) {
            fprintf(stderr, "cap_client: cannot map\n");
            return 1;
        }
        ((release_fn)sym("cuMemRelease"))(h);
        mapped++;
    }
    ((unmap_fn)sym("cuMemUnmap"))(va, piece * (size_t)mapped); /* the whole range at once */
    CUmemGenericAllocationHandle h = 0;
    CUresult again = ((create_fn)sym("cuMemCreate"))(&h, lim, &prop, 0);
    printf("cap mmap mapped=%d again=%d\n", mapped, again);
    return 0;
}

#define THREADS 8
static CUdeviceptr got[THREADS][4096];
static int ngot[THREADS];

static void *filler(void *arg)
{
    int t = (int)(intptr_t)arg;
    alloc_fn alloc = (alloc_fn)sym("cuMemAlloc");
    while (ngot[t] < 4096 && alloc(&got[t][ngot[t]], 1 << 20) == CUDA_SUCCESS)
        ngot[t]++;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: cap_client alloc|pitch|managed|async|pool|vmm LIMIT\n");
        return 2;
    }
    path = argv[1];
    unit = strtoull(argv[2], NULL, 10) / 4;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "cap_client: %s\n", dlerror());
        return 2;
    }
    gpa = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    ((init_fn)dlsym(lib, "cuInit"))(0);
    CUcontext ctx;
    ((retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    ((defpool_fn)sym("cuDeviceGetDefaultMemPool"))(&pool, 0);
    info_fn info = (info_fn)sym("cuMemGetInfo");
    if (!strcmp(path, "retain"))
        return retained(unit * 4);
    if (!strcmp(path, "mmap"))
        return mmap_pattern(unit * 4);
    if (!strcmp(path, "threads")) {
        pthread_t th[THREADS];
        for (int t = 0; t < THREADS; t++)
            pthread_create(&th[t], NULL, filler, (void *)(intptr_t)t);
        int n = 0;
        for (int t = 0; t < THREADS; t++) {
            pthread_join(th[t], NULL);
            n += ngot[t];
        }
        for (int t = 0; t < THREADS; t++)
            for (int i = 0; i < ngot[t]; i++)
                ((free_fn)sym("cuMemFree"))(got[t][i]);
        size_t fr = 0, tot = 0;
        info(&fr, &tot);
        printf("cap threads got=%d free_after=%zu\n", n, fr);
        return 0;
    }

    unsigned long long keys[4], extra = 0, small = 0;
    char fill[64] = "";
    for (int i = 0; i < 4; i++) {
        CUresult r = take(&keys[i]);
        snprintf(fill + strlen(fill), sizeof(fill) - strlen(fill), "%s%d", i ? "," : "", r);
    }
    size_t total = 0, free_full = 0, free_empty = 0;
    info(&free_full, &total);
    CUresult over = take(&extra);
    CUresult over_small = ((alloc_fn)sym("cuMemAlloc"))(&small, 1 << 20);
    CUresult freed = give(keys[0]);
    CUresult again = take(&keys[0]);
    for (int i = 0; i < 4; i++)
        if (keys[i] != 0)
            give(keys[i]);
    if (extra != 0)
        give(extra);
    if (small != 0)
        ((free_fn)sym("cuMemFree"))(small);
    info(&free_empty, &total);
    printf("cap %s fill=%s over=%d over_small=%d freed=%d again=%d total=%zu free_full=%zu free_empty=%zu\n", path,
           fill, over, over_small, freed, again, total, free_full, free_empty);
    return 0;
}
