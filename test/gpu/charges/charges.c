/*
 * What the shim's memory limit and the claim ledger charge, on the real driver (test/gpu/charges/run.sh).
 * Reaches the driver as CUDA 12+ applications do, through cuGetProcAddress_v2 from libcuda.so.1, so that
 * under LD_PRELOAD the shim's answers are what runs.
 *
 *   charges ctx EXTRA     the primary context and EXTRA more (cuCtxCreate), then cuMemAlloc of 64 MiB in
 *                         the primary context until refused; prints "ctx pid=P got=BYTES", then holds
 *                         everything until a line on stdin
 *   charges import L      a handle of L/2 exported and imported again, the import mapped and the original
 *                         released: "import same_handle=0|1 fits=R over=R again=R" (as shim/tests/cap_client)
 *   charges foreign L     a child process exports a handle of L/2 through a Unix socket; this process
 *                         imports and maps it: "foreign over=R released=R unmapped=R"
 *   charges gran L        cuMemAlloc of 2 MiB + 1 byte until refused: "gran got=N"
 *   charges measure       no limit: what the driver takes (cuMemGetInfo's free before and after) for 256
 *                         allocations of several sizes, a 512 MiB malloc heap and arrays, against what
 *                         the shim charges: "measure WHAT took=BYTES charged=BYTES"
 * R: CUresult numbers (0 success, 2 out of memory).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa2_fn gpa;

static void *sym(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || p == NULL) {
        fprintf(stderr, "charges: cannot resolve %s\n", name);
        exit(2);
    }
    return p;
}

#define CALL(T, name, ...) ((CUresult(*) T)sym(name))(__VA_ARGS__)

static CUcontext primary;

/* Makes c current (the stub driver, for trying this program without a GPU, has one implicit context). */
static void set_current(CUcontext c)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa("cuCtxSetCurrent", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS && p != NULL)
        ((CUresult(*)(CUcontext))p)(c);
}

static void init(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "charges: %s\n", dlerror());
        exit(2);
    }
    gpa = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    ((CUresult(*)(unsigned))dlsym(lib, "cuInit"))(0);
    if (CALL((CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", &primary, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "charges: no context\n");
        exit(2);
    }
    set_current(primary);
}

static CUresult probe(size_t n)
{
    CUdeviceptr d = 0;
    CUresult r = CALL((CUdeviceptr *, size_t), "cuMemAlloc", &d, n);
    if (r == CUDA_SUCCESS)
        CALL((CUdeviceptr), "cuMemFree", d);
    return r;
}

static size_t free_now(void)
{
    size_t f = 0, t = 0;
    CALL((size_t *, size_t *), "cuMemGetInfo", &f, &t);
    return f;
}

static CUmemAllocationProp fd_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

static CUdeviceptr reserve(size_t n)
{
    CUdeviceptr va = 0;
    if (CALL((CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long), "cuMemAddressReserve", &va, n, 0, 0,
             0) != CUDA_SUCCESS) {
        fprintf(stderr, "charges: cannot reserve\n");
        exit(1);
    }
    return va;
}

static CUresult map_rw(CUdeviceptr va, size_t n, CUmemGenericAllocationHandle h)
{
    CUresult r = CALL((CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long), "cuMemMap", va,
                      n, 0, h, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemAccessDesc a = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return CALL((CUdeviceptr, size_t, const CUmemAccessDesc *, size_t), "cuMemSetAccess", va, n, &a, 1);
}

static int ctx_mode(int extra)
{
    init();
    for (int i = 0; i < extra; i++) {
        CUcontext c;
        if (CALL((CUcontext *, unsigned, CUdevice), "cuCtxCreate", &c, 0, 0) != CUDA_SUCCESS) {
            fprintf(stderr, "charges: cuCtxCreate failed\n");
            return 1;
        }
        CUdeviceptr d = 0; /* a first allocation makes the context's own memory real */
        if (CALL((CUdeviceptr *, size_t), "cuMemAlloc", &d, 1 << 20) == CUDA_SUCCESS)
            CALL((CUdeviceptr), "cuMemFree", d);
    }
    set_current(primary);
    size_t got = 0;
    CUdeviceptr d;
    while (CALL((CUdeviceptr *, size_t), "cuMemAlloc", &d, 64u << 20) == CUDA_SUCCESS)
        got += 64u << 20;
    printf("ctx pid=%d got=%zu\n", (int)getpid(), got);
    fflush(stdout);
    char line[8];
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 0;
    return 0;
}

static int import_mode(size_t lim)
{
    init();
    CUmemAllocationProp p = fd_prop();
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    int fd = -1;
    CUdeviceptr va = reserve(lim / 2);
    if (CALL((CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long), "cuMemCreate",
             &h1, lim / 2, &p, 0) != CUDA_SUCCESS ||
        CALL((void *, CUmemGenericAllocationHandle, int, unsigned long long), "cuMemExportToShareableHandle", &fd, h1,
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS ||
        CALL((CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType), "cuMemImportFromShareableHandle", &h2,
             (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
        map_rw(va, lim / 2, h2) != CUDA_SUCCESS) {
        fprintf(stderr, "charges: cannot export, import and map a handle\n");
        return 1;
    }
    CALL((CUmemGenericAllocationHandle), "cuMemRelease", h1);
    CUresult fits = probe(lim / 4), over = probe(lim / 2 + (1 << 20));
    /* which handle the driver gives for the mapping: the import's own (counted), or another value */
    CUmemGenericAllocationHandle h3 = 0;
    int same_retain = -1;
    if (CALL((CUmemGenericAllocationHandle *, void *), "cuMemRetainAllocationHandle", &h3, (void *)(uintptr_t)va) ==
        CUDA_SUCCESS) {
        same_retain = h3 == h2 ? 2 : h3 == h1 ? 1 : 0;
        CALL((CUmemGenericAllocationHandle), "cuMemRelease", h3);
    }
    CALL((CUdeviceptr, size_t), "cuMemUnmap", va, lim / 2);
    CALL((CUmemGenericAllocationHandle), "cuMemRelease", h2);
    CUresult again = probe(lim / 2 + (1 << 20));
    /* same_retain: 2 the import's handle, 1 the original's, 0 another, -1 the call failed */
    printf("import same_handle=%d same_retain=%d fits=%d over=%d again=%d\n", h1 == h2, same_retain, fits, over,
           again);
    return 0;
}

static int foreign_mode(size_t lim)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 1;
    pid_t child = fork();
    if (child == 0) {
        close(sv[1]);
        init();
        CUmemAllocationProp p = fd_prop();
        CUmemGenericAllocationHandle h = 0;
        int fd = -1;
        if (CALL((CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long),
                 "cuMemCreate", &h, lim / 2, &p, 0) != CUDA_SUCCESS ||
            CALL((void *, CUmemGenericAllocationHandle, int, unsigned long long), "cuMemExportToShareableHandle", &fd,
                 h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS)
            _exit(1);
        char c = 'x', cb[CMSG_SPACE(sizeof(int))];
        struct iovec io = {.iov_base = &c, .iov_len = 1};
        struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof(cb)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        if (sendmsg(sv[0], &m, 0) != 1)
            _exit(1);
        (void)!read(sv[0], &c, 1); /* hold the memory until the importer is done (or gone) */
        _exit(0);
    }
    close(sv[0]);
    init();
    char c, cb[CMSG_SPACE(sizeof(int))];
    struct iovec io = {.iov_base = &c, .iov_len = 1};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof(cb)};
    int fd = -1;
    if (recvmsg(sv[1], &m, 0) == 1 && CMSG_FIRSTHDR(&m) != NULL)
        memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = reserve(lim / 2);
    if (fd < 0 ||
        CALL((CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType), "cuMemImportFromShareableHandle", &h,
             (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
        map_rw(va, lim / 2, h) != CUDA_SUCCESS) {
        fprintf(stderr, "charges: cannot import and map another process's handle\n");
        return 1;
    }
    CUresult over = probe(lim / 2 + (1 << 20));
    CALL((CUmemGenericAllocationHandle), "cuMemRelease", h);
    CUresult released = probe(lim / 2 + (1 << 20));
    CALL((CUdeviceptr, size_t), "cuMemUnmap", va, lim / 2);
    CUresult unmapped = probe(lim / 2 + (1 << 20));
    (void)!write(sv[1], "x", 1);
    waitpid(child, NULL, 0);
    printf("foreign over=%d released=%d unmapped=%d\n", over, released, unmapped);
    return 0;
}

static int gran_mode(void)
{
    init();
    static CUdeviceptr held[8192];
    int n = 0;
    while (n < 8192 && CALL((CUdeviceptr *, size_t), "cuMemAlloc", &held[n], (2u << 20) + 1) == CUDA_SUCCESS)
        n++;
    printf("gran got=%d\n", n);
    return 0;
}

/* What the shim would charge: whole 2 MiB granules above half a granule (shim/src/cap.c gs_cap_size). */
static size_t charged(size_t n)
{
    size_t g = 2u << 20;
    return n <= g / 2 ? n : (n + g - 1) / g * g;
}

static int measure_mode(void)
{
    init();
    static CUdeviceptr held[256];
    static const size_t sizes[] = {64u << 10, (1u << 20) + 1, 2u << 20, (2u << 20) + 1, (3u << 20) + 1};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t before = free_now();
        for (int i = 0; i < 256; i++)
            CALL((CUdeviceptr *, size_t), "cuMemAlloc", &held[i], sizes[s]);
        size_t after = free_now();
        printf("measure alloc-256x%zu took=%zu charged=%zu\n", sizes[s], before - after, 256 * charged(sizes[s]));
        for (int i = 0; i < 256; i++)
            CALL((CUdeviceptr), "cuMemFree", held[i]);
    }
    size_t before = free_now();
    CUresult r = CALL((CUlimit, size_t), "cuCtxSetLimit", CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)512 << 20);
    printf("measure heap-512MiB result=%d took=%zu charged=%zu\n", r, before - free_now(), (size_t)512 << 20);
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = 16384, .Format = 0x20, .NumChannels = 4};
    CUarray a = NULL;
    before = free_now();
    r = CALL((CUarray *, const CUDA_ARRAY_DESCRIPTOR *), "cuArrayCreate", &a, &d);
    printf("measure array-1024x16384-float4 result=%d took=%zu charged=%zu\n", r, before - free_now(),
           charged((size_t)1024 * 16384 * 16));
    CUDA_ARRAY3D_DESCRIPTOR md = {.Width = 4096, .Height = 4096, .Format = 0x20, .NumChannels = 1};
    CUmipmappedArray mm = NULL;
    before = free_now();
    r = CALL((CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned), "cuMipmappedArrayCreate", &mm, &md, 13);
    size_t tex = 0;
    for (int l = 0; l < 13; l++)
        tex += (size_t)((4096 >> l) ? (4096 >> l) : 1) * ((4096 >> l) ? (4096 >> l) : 1) * 4;
    printf("measure mipmapped-4096x4096-float-13 result=%d took=%zu charged=%zu\n", r, before - free_now(),
           charged(tex));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: charges ctx EXTRA | import L | foreign L | gran | measure\n");
        return 2;
    }
    size_t arg = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    if (!strcmp(argv[1], "ctx"))
        return ctx_mode((int)arg);
    if (!strcmp(argv[1], "import"))
        return import_mode(arg);
    if (!strcmp(argv[1], "foreign"))
        return foreign_mode(arg);
    if (!strcmp(argv[1], "gran"))
        return gran_mode();
    if (!strcmp(argv[1], "measure"))
        return measure_mode();
    return 2;
}
