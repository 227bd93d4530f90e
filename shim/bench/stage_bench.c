/*
 * Host staging costs on a GPU machine (driver API through dlopen, builds with gcc, no shim):
 *   stage_bench BYTES THREADS          (built by make -C shim testbins: build/bench/stage_bench)
 *   stage_bench BYTES THREADS scale    only faulting in, on 1..16 threads, huge pages and 4 KiB pages
 * For BYTES of 2 MiB-aligned anonymous memory asking for transparent huge pages, in 64 MiB pieces
 * (the shim's STAGE_CHUNK), prints the rate of each way a swap-out can reach host memory:
 *   populate      faulting the pages in (MADV_POPULATE_WRITE), 1 and THREADS threads
 *   register      cuMemHostRegister of populated pieces; of pieces not faulted in yet
 *   dtoh          device->host copy into pinned, populated-pageable and fresh-pageable memory
 *   bounce        device->host into a pinned 2 x 64 MiB ring, THREADS threads memcpy into fresh memory
 * It tells which design keeps a job's first swap-out (staging allocated ~2 s earlier) near the
 * pinned rate: pinning ahead (populate + register), or copying through a small pinned ring.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cuda_abi.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PIECE ((size_t)64 << 20)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*reg_fn)(void *, size_t, unsigned);
typedef CUresult (*unreg_fn)(void *);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*dtoha_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*ssync_fn)(CUstream);
typedef CUresult (*screate_fn)(CUstream *, unsigned);
typedef CUresult (*set32_fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*sync_fn)(void);

#define BENCH_NAME "stage_bench"
#include "bench_dl.h"

static char *thp_map(size_t size)
{
    const size_t huge = (size_t)2 << 20;
    char *raw = mmap(NULL, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    char *p = (char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    (void)madvise(p, size, MADV_HUGEPAGE);
    return p;
}

struct job {
    char *p;
    size_t n;
    const char *src; /* memcpy source, or NULL: populate */
};

static void *worker(void *a)
{
    struct job *j = a;
    if (j->src)
        memcpy(j->p, j->src, j->n);
    else
        (void)madvise(j->p, j->n, MADV_POPULATE_WRITE);
    return NULL;
}

/* Runs the job split over t threads (by 2 MiB-aligned parts). */
static void split(char *p, size_t n, const char *src, int t)
{
    pthread_t th[64];
    struct job jb[64];
    size_t part = (n / (size_t)t + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    int k = 0;
    for (size_t off = 0; off < n && k < 64; off += part, k++) {
        jb[k] = (struct job){p + off, off + part > n ? n - off : part, src ? src + off : NULL};
        pthread_create(&th[k], NULL, worker, &jb[k]);
    }
    for (int i = 0; i < k; i++)
        pthread_join(th[i], NULL);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: stage_bench BYTES THREADS\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10) / PIECE * PIECE;
    int threads = atoi(argv[2]);
    if (open_driver() != 0)
        return 2;
    reg_fn reg = (reg_fn)sym("cuMemHostRegister_v2");
    dtoh_fn dtoh = (dtoh_fn)sym("cuMemcpyDtoH_v2");
    dtoha_fn dtoha = (dtoha_fn)sym("cuMemcpyDtoHAsync_v2");
    ssync_fn ssync = (ssync_fn)sym("cuStreamSynchronize");
    CUstream s;
    ((screate_fn)sym("cuStreamCreate"))(&s, 1);
    CUdeviceptr d;
    if (((alloc_fn)sym("cuMemAlloc_v2"))(&d, bytes) != CUDA_SUCCESS)
        return 2;
    ((set32_fn)sym("cuMemsetD32_v2"))(d, 7, bytes / 4);
    ((sync_fn)sym("cuCtxSynchronize"))();
    double gb = bytes / 1e9, t0, t1;
    printf("stage_bench: %zu bytes, %d threads, pieces of %zu MiB\n", bytes, threads, PIECE >> 20);
    if (argc > 3) { /* populate scaling only: fresh mappings, THP and 4 KiB pages */
        for (int thp = 1; thp >= 0; thp--)
            for (int t = 1; t <= 16; t *= 2) {
                char *m = thp_map(bytes);
                if (!thp)
                    (void)madvise(m, bytes, MADV_NOHUGEPAGE);
                t0 = now();
                split(m, bytes, NULL, t);
                t1 = now();
                printf("populate %s %2d threads %6.2f GB/s\n", thp ? "thp" : "4k ", t, gb / (t1 - t0));
                munmap(m, bytes);
            }
        return 0;
    }

    char *a = thp_map(bytes);
    t0 = now();
    split(a, bytes, NULL, 1);
    t1 = now();
    printf("populate 1 thread          %6.2f GB/s\n", gb / (t1 - t0));
    t0 = now();
    for (size_t off = 0; off < bytes; off += PIECE)
        reg(a + off, PIECE, 0);
    t1 = now();
    printf("register populated         %6.2f GB/s (%.1f ms per piece)\n", gb / (t1 - t0),
           (t1 - t0) * 1e3 / (double)(bytes / PIECE));
    t0 = now();
    for (size_t off = 0; off < bytes; off += PIECE)
        dtoha(a + off, d + off, PIECE, s);
    ssync(s);
    t1 = now();
    printf("dtoh pinned                %6.2f GB/s\n", gb / (t1 - t0));

    char *b = thp_map(bytes);
    t0 = now();
    split(b, bytes, NULL, threads);
    t1 = now();
    printf("populate %2d threads        %6.2f GB/s\n", threads, gb / (t1 - t0));
    t0 = now();
    dtoh(b, d, bytes);
    t1 = now();
    printf("dtoh pageable populated    %6.2f GB/s\n", gb / (t1 - t0));

    char *c = thp_map(bytes);
    t0 = now();
    for (size_t off = 0; off < bytes; off += PIECE)
        reg(c + off, PIECE, 0);
    t1 = now();
    printf("register not populated     %6.2f GB/s (%.1f ms per piece)\n", gb / (t1 - t0),
           (t1 - t0) * 1e3 / (double)(bytes / PIECE));

    char *e = thp_map(bytes);
    t0 = now();
    dtoh(e, d, bytes);
    t1 = now();
    printf("dtoh pageable fresh        %6.2f GB/s\n", gb / (t1 - t0));

    /* pinned ring of two pieces: copy piece i+1 while the CPU spreads piece i over threads */
    char *ring = thp_map(2 * PIECE);
    split(ring, 2 * PIECE, NULL, 1);
    reg(ring, 2 * PIECE, 0);
    for (int pass = 0; pass < 2; pass++) {
        char *f = thp_map(bytes);
        if (pass == 1)
            split(f, bytes, NULL, threads);
        t0 = now();
        size_t np = bytes / PIECE;
        dtoha(ring, d, PIECE, s);
        for (size_t i = 0; i < np; i++) {
            ssync(s);
            if (i + 1 < np)
                dtoha(ring + ((i + 1) % 2) * PIECE, d + (i + 1) * PIECE, PIECE, s);
            split(f + i * PIECE, PIECE, ring + (i % 2) * PIECE, threads);
        }
        ssync(s);
        t1 = now();
        printf("bounce ring -> %s %6.2f GB/s\n", pass ? "populated  " : "fresh      ", gb / (t1 - t0));
    }
    /* what a swap sees while the stager pins: populate THREADS-wide ahead of a register thread */
    char *g = thp_map(bytes);
    t0 = now();
    for (size_t off = 0; off < bytes; off += (size_t)threads * PIECE) {
        size_t n = bytes - off < (size_t)threads * PIECE ? bytes - off : (size_t)threads * PIECE;
        split(g + off, n, NULL, threads);
        for (size_t k = 0; k < n; k += PIECE)
            reg(g + off + k, PIECE, 0);
    }
    t1 = now();
    printf("populate %2d + register     %6.2f GB/s\n", threads, gb / (t1 - t0));
    return 0;
}
