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
 *   cap_client held L     a cuMemCreate handle of L/2, mapped, retained through its address, then released
 *                         and unmapped: only the retained handle holds it. Prints "cap held held=R gone=R":
 *                         an allocation of L/2 + 1 MiB fails while it does (2) and succeeds after (0),
 *                         whatever handle value the driver gives for the retain
 *   cap_client vmmsteps L SEED  a seeded random mix of VMM calls (see vmm_steps)
 *   cap_client mmap L     vectorAddMMAP's pattern (see mmap_pattern)
 *   cap_client threads L  8 threads allocate 1 MiB blocks with cuMemAlloc until refused, then free them
 *                         all. Prints "cap threads got=N free_after=F": N must be L / 1 MiB exactly
 *   cap_client import L   a handle of L/2 exported and imported again (the same memory), the import mapped
 *                         and the original released (see import_own)
 *   cap_client unknown L  a handle the shim never saw made, mapped, released, unmapped (see unknown)
 *   cap_client gran L     cuMemAlloc of 2 MiB + 1 byte until refused. Prints "cap gran got=N": N must be
 *                         L / 4 MiB (the driver takes whole 2 MiB granules)
 *   cap_client heap L     the device malloc heap sized with cuCtxSetLimit (see heap)
 *   cap_client array L    arrays and a mipmapped array (see arrays)
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
typedef CUresult (*export_fn)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
typedef CUresult (*import_fn)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
typedef CUresult (*unseen_fn)(CUmemGenericAllocationHandle *, size_t);
typedef CUresult (*setlimit_fn)(CUlimit, size_t);
typedef CUresult (*array_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*array3d_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult (*mipmapped_fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef CUresult (*adestroy_fn)(CUarray);
typedef CUresult (*mdestroy_fn)(CUmipmappedArray);
static void *lib;


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

/* A cuMemAlloc of n bytes, freed at once when it succeeded; its result. */
static CUresult probe(size_t n)
{
    CUdeviceptr d = 0;
    CUresult r = ((alloc_fn)sym("cuMemAlloc"))(&d, n);
    if (r == CUDA_SUCCESS)
        ((free_fn)sym("cuMemFree"))(d);
    return r;
}

static CUdeviceptr reserve(size_t n)
{
    CUdeviceptr va = 0;
    if (((reserve_fn)sym("cuMemAddressReserve"))(&va, n, 0, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "cap_client: cannot reserve\n");
        exit(1);
    }
    return va;
}

/* An export of this process's own handle h1 (L/2) imported again as h2 is the same memory: mapped
 * through h2 with h1 released, it is charged once (fits: L/4 more fits, 0), and it stays charged while h2
 * holds it (over: L/2 + 1 MiB more is refused, 2); once h2 is unmapped and released it is given back
 * (again: 0). Prints "cap import fits=R over=R again=R". */
static int import_own(size_t lim)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    int fd = -1;
    CUdeviceptr va = reserve(lim / 2);
    if (((create_fn)sym("cuMemCreate"))(&h1, lim / 2, &prop, 0) != CUDA_SUCCESS ||
        ((export_fn)sym("cuMemExportToShareableHandle"))(&fd, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
            CUDA_SUCCESS ||
        ((import_fn)sym("cuMemImportFromShareableHandle"))(&h2, (void *)(intptr_t)fd,
                                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
        ((map_fn)sym("cuMemMap"))(va, lim / 2, 0, h2, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "cap_client: cannot export, import and map a handle\n");
        return 1;
    }
    ((release_fn)sym("cuMemRelease"))(h1);
    CUresult fits = probe(lim / 4);
    CUresult over = probe(lim / 2 + (1 << 20));
    ((unmap_fn)sym("cuMemUnmap"))(va, lim / 2);
    ((release_fn)sym("cuMemRelease"))(h2);
    CUresult again = probe(lim / 2 + (1 << 20));
    printf("cap import fits=%d over=%d again=%d\n", fits, over, again);
    return 0;
}

/* A handle the shim never saw (made past it, as one imported from another process is): mapping it
 * charges its size (over: 2), releasing it while mapped keeps the charge (released: 2), unmapping gives
 * it back (unmapped: 0); one larger than the limit is not mapped at all (big: 2).
 * Prints "cap unknown over=R released=R unmapped=R big=R". */
static int unknown(size_t lim)
{
    unseen_fn unseen = (unseen_fn)dlsym(lib, "gsStubMemCreateUnseen");
    CUmemGenericAllocationHandle h = 0, hb = 0;
    CUdeviceptr va = reserve(lim / 2), vb = reserve(lim + (2u << 20));
    if (unseen == NULL || unseen(&h, lim / 2) != CUDA_SUCCESS || unseen(&hb, lim + (2u << 20)) != CUDA_SUCCESS ||
        ((map_fn)sym("cuMemMap"))(va, lim / 2, 0, h, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "cap_client: cannot make and map a handle past the shim\n");
        return 1;
    }
    CUresult over = probe(lim / 2 + (1 << 20));
    ((release_fn)sym("cuMemRelease"))(h);
    CUresult released = probe(lim / 2 + (1 << 20));
    ((unmap_fn)sym("cuMemUnmap"))(va, lim / 2);
    CUresult unmapped = probe(lim / 2 + (1 << 20));
    CUresult big = ((map_fn)sym("cuMemMap"))(vb, lim + (2u << 20), 0, hb, 0);
    printf("cap unknown over=%d released=%d unmapped=%d big=%d\n", over, released, unmapped, big);
    return 0;
}

/* The device malloc heap counts in the limit: sized at L/2 (set: 0), L/2 + 1 MiB more is refused
 * (over: 2); a heap past the limit is refused (big: 2); lowered to 8 MiB, the rest comes back (after: 0).
 * Prints "cap heap set=R over=R big=R lowered=R after=R". */
static int heap(size_t lim)
{
    setlimit_fn set = (setlimit_fn)sym("cuCtxSetLimit");
    CUresult s1 = set(CU_LIMIT_MALLOC_HEAP_SIZE, lim / 2);
    CUresult over = probe(lim / 2 + (1 << 20));
    CUresult big = set(CU_LIMIT_MALLOC_HEAP_SIZE, lim + 1);
    CUresult low = set(CU_LIMIT_MALLOC_HEAP_SIZE, 8u << 20);
    CUresult after = probe(lim - (8u << 20));
    printf("cap heap set=%d over=%d big=%d lowered=%d after=%d\n", s1, over, big, low, after);
    return 0;
}

/* Arrays count in the limit by their texels' bytes: a 2D float4 array of L/2 (made: 0) leaves no room
 * for L/2 + 1 MiB (over: 2) and gives it back when destroyed (freed: 0); a layered 3D array of L/2 leaves
 * none either (layered: 2); a mipmapped array whose levels pass the limit is refused (mip: 2) where its
 * first level alone would fit. Prints "cap array made=R over=R freed=R layered=R mip=R". */
static int arrays(size_t lim)
{
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = lim / 2 / (1024 * 16), .Format = 0x20, .NumChannels = 4};
    CUarray a = NULL, b = NULL;
    CUresult made = ((array_fn)sym("cuArrayCreate"))(&a, &d);
    CUresult over = probe(lim / 2 + (1 << 20));
    ((adestroy_fn)sym("cuArrayDestroy"))(a);
    CUresult freed = probe(lim / 2 + (1 << 20));
    CUDA_ARRAY3D_DESCRIPTOR l = {.Width = 1024, .Height = 1024, .Depth = lim / 2 / (1024 * 1024 * 4),
                                 .Format = 0x03, .NumChannels = 1, .Flags = 0x01 /* LAYERED */};
    CUresult made3d = ((array3d_fn)sym("cuArray3DCreate"))(&b, &l);
    CUresult layered = probe(lim / 2 + (1 << 20));
    ((adestroy_fn)sym("cuArrayDestroy"))(b);
    /* level 0 is 7/8 of the limit; with the levels below it, more than the limit */
    CUDA_ARRAY3D_DESCRIPTOR m = {.Width = 2048, .Height = lim / 8 * 7 / (2048 * 4), .Format = 0x20, .NumChannels = 1};
    CUmipmappedArray mm = NULL;
    CUresult mip = ((mipmapped_fn)sym("cuMipmappedArrayCreate"))(&mm, &m, 4);
    if (mip == CUDA_SUCCESS)
        ((mdestroy_fn)sym("cuMipmappedArrayDestroy"))(mm);
    printf("cap array made=%d over=%d freed=%d made3d=%d layered=%d mip=%d\n", made, over, freed, made3d, layered,
           mip);
    return 0;
}

static int held_by_retain(size_t lim)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr va = 0;
    if (((create_fn)sym("cuMemCreate"))(&h, lim / 2, &prop, 0) != CUDA_SUCCESS ||
        ((reserve_fn)sym("cuMemAddressReserve"))(&va, lim / 2, 0, 0, 0) != CUDA_SUCCESS ||
        ((map_fn)sym("cuMemMap"))(va, lim / 2, 0, h, 0) != CUDA_SUCCESS ||
        ((retainh_fn)sym("cuMemRetainAllocationHandle"))(&h2, (void *)(uintptr_t)va) != CUDA_SUCCESS) {
        fprintf(stderr, "cap_client: cannot set up the retained handle\n");
        return 1;
    }
    ((release_fn)sym("cuMemRelease"))(h);
    ((unmap_fn)sym("cuMemUnmap"))(va, lim / 2);
    CUresult held = probe(lim / 2 + (1 << 20));
    ((release_fn)sym("cuMemRelease"))(h2);
    CUresult gone = probe(lim / 2 + (1 << 20));
    printf("cap held held=%d gone=%d\n", held, gone);
    return 0;
}

/* A seeded random mix of cuMemCreate, export and import of one's own handle, cuMemMap, cuMemUnmap,
 * cuMemRelease and cuMemRetainAllocationHandle over up to 6 allocations of L/8, each mapped at most once
 * (the stub's rule). After every step what the limit charges (the limit less cuMemGetInfo's free) must be
 * exactly the bytes of the allocations still alive (a reference or a mapping left): an import or a retain
 * never counted twice, a release or an unmap never giving back what another handle or mapping holds.
 * At the end everything is let go and nothing may stay charged. Prints "cap vmmsteps steps=N ok" or the
 * first step where the charge and the memory held differ. */
#define NALLOC 6
#define NREF 16
static int vmm_steps(size_t lim, unsigned seed)
{
    struct {
        int alive, mapped;
        CUdeviceptr va;
        CUmemGenericAllocationHandle refs[NREF];
        int nref;
    } a[NALLOC];
    memset(a, 0, sizeof(a));
    size_t piece = lim / 8;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    info_fn info = (info_fn)sym("cuMemGetInfo");
    srand(seed);
    int steps = 400;
    for (int step = 0; step <= steps; step++) {
        int i = rand() % NALLOC, op = rand() % 6;
        if (step == steps)
            op = -1; /* the end: let everything go */
        for (int k = 0; k < NALLOC; k++) {
            if (op != -1 && k != i)
                continue;
            if (op == 0 && !a[k].alive) {
                CUmemGenericAllocationHandle h = 0;
                if (((create_fn)sym("cuMemCreate"))(&h, piece, &prop, 0) == CUDA_SUCCESS) {
                    a[k].alive = 1;
                    a[k].refs[a[k].nref++] = h;
                    if (a[k].va == 0)
                        a[k].va = reserve(piece);
                }
            } else if (op == 1 && a[k].nref > 0 && a[k].nref < NREF) {
                int fd = -1;
                CUmemGenericAllocationHandle h2 = 0;
                if (((export_fn)sym("cuMemExportToShareableHandle"))(&fd, a[k].refs[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS &&
                    ((import_fn)sym("cuMemImportFromShareableHandle"))(&h2, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS)
                    a[k].refs[a[k].nref++] = h2;
            } else if (op == 2 && a[k].nref > 0 && !a[k].mapped) {
                if (((map_fn)sym("cuMemMap"))(a[k].va, piece, 0, a[k].refs[rand() % a[k].nref], 0) == CUDA_SUCCESS)
                    a[k].mapped = 1;
            } else if ((op == 3 || op == -1) && a[k].mapped) {
                ((unmap_fn)sym("cuMemUnmap"))(a[k].va, piece);
                a[k].mapped = 0;
            } else if (op == 5 && a[k].mapped && a[k].nref < NREF) {
                CUmemGenericAllocationHandle h3 = 0;
                if (((retainh_fn)sym("cuMemRetainAllocationHandle"))(&h3, (void *)(uintptr_t)a[k].va) == CUDA_SUCCESS)
                    a[k].refs[a[k].nref++] = h3;
            }
            if ((op == 4 && a[k].nref > 0) || op == -1) {
                while (a[k].nref > 0) {
                    int r = op == -1 ? a[k].nref - 1 : rand() % a[k].nref;
                    ((release_fn)sym("cuMemRelease"))(a[k].refs[r]);
                    a[k].refs[r] = a[k].refs[--a[k].nref];
                    if (op != -1)
                        break;
                }
            }
            a[k].alive = a[k].nref > 0 || a[k].mapped;
        }
        size_t held = 0, fr = 0, tot = 0;
        for (int k = 0; k < NALLOC; k++)
            held += a[k].alive ? piece : 0;
        info(&fr, &tot);
        if (getenv("VMMTRACE")) {
            fprintf(stderr, "step %d op %d alloc %d charged %zu held %zu |", step, op, i, (lim - fr) >> 20, held >> 20);
            for (int k = 0; k < NALLOC; k++) {
                fprintf(stderr, " %d:%s%s[", k, a[k].alive ? "A" : "-", a[k].mapped ? "M" : "");
                for (int r = 0; r < a[k].nref; r++)
                    fprintf(stderr, "%llx ", (unsigned long long)a[k].refs[r] & 0xffff);
                fprintf(stderr, "]");
            }
            fprintf(stderr, "\n");
        }
        if (lim - fr != held) {
            printf("cap vmmsteps step=%d op=%d charged=%zu held=%zu\n", step, op, lim - fr, held);
            return 0;
        }
    }
    printf("cap vmmsteps steps=%d ok\n", steps);
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
    if (argc < 3) {
        fprintf(stderr, "usage: cap_client alloc|pitch|managed|async|pool|vmm LIMIT\n");
        return 2;
    }
    path = argv[1];
    unit = strtoull(argv[2], NULL, 10) / 4;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
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
    if (!strcmp(path, "vmmsteps"))
        return vmm_steps(unit * 4, argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 1);
    if (!strcmp(path, "held"))
        return held_by_retain(unit * 4);
    if (!strcmp(path, "import"))
        return import_own(unit * 4);
    if (!strcmp(path, "unknown"))
        return unknown(unit * 4);
    if (!strcmp(path, "heap"))
        return heap(unit * 4);
    if (!strcmp(path, "array"))
        return arrays(unit * 4);
    if (!strcmp(path, "gran")) {
        static CUdeviceptr held[4096];
        int n = 0;
        while (n < 4096 && ((alloc_fn)sym("cuMemAlloc"))(&held[n], (2u << 20) + 1) == CUDA_SUCCESS)
            n++;
        for (int i = 0; i < n; i++)
            ((free_fn)sym("cuMemFree"))(held[i]);
        printf("cap gran got=%d\n", n);
        return 0;
    }
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
