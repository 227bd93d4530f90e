/*
 * The memory manager's shared state, for its three front ends:
 *   mm.c        regions, slabs, swapping, budget (cuMemAlloc memory)
 *   mm_async.c  the stream-ordered allocator (cuMemAllocAsync) over regions
 *   mm_vmm.c    the application's own cuMemCreate handles as regions
 * Everything here is used with mm_mu held unless it says otherwise.
 */
#ifndef GS_MM_INTERNAL_H
#define GS_MM_INTERNAL_H

#include <pthread.h>

#include "internal.h"

#define REAL(name) ((gs_fn_##name)gs_real(GS_ID_##name))

struct block {
    size_t off, size; /* size rounded to SLAB_ALIGN */
    size_t user;      /* bytes asked for */
    uint64_t id;
    int used;
};

/* Where the application mapped (part of) one of its handles, and who may access it. */
#define MM_MAX_ACCESS 8
struct app_map {
    CUdeviceptr va;
    size_t size, off;
    CUmemAccessDesc acc[MM_MAX_ACCESS];
    int nacc;
};

/* Staging is page-locked and copied in pieces of this size: one cuMemHostRegister holds the driver
 * (the application's calls wait) for as long as it pins, so a whole large allocation at once stalled
 * the process's start-up for seconds on the H100; a copy never spans two registrations. */
#define STAGE_CHUNK ((size_t)64 << 20)

struct region {
    CUdeviceptr va; /* the application's pointer; for a handle, our private range (also the handle's value) */
    size_t size;    /* reserved = physical bytes, a multiple of the granularity */
    size_t user;    /* bytes asked for (whole-region allocations), of them in this segment */
    /* A large cuMemAlloc is split into segments, one region each (mm.c, new_split_locked); a region
     * not split is its allocation's only segment. */
    CUdeviceptr base; /* the allocation's address (its first segment's va) */
    size_t base_user; /* the bytes the allocation asked for */
    size_t span;      /* address range this region frees: the allocation's on its first segment, else 0 */
    int slab;
    CUcontext ctx;
    CUdevice dev;
    CUmemAllocationProp prop; /* what cuMemCreate is given at every swap in */
    CUmemGenericAllocationHandle h;
    int resident;
    void *staging;
    int pinned;     /* staging is page-locked, all of it */
    size_t pin_off; /* bytes of staging page-locked so far, from its start, in STAGE_CHUNK registrations */
    uint64_t pin_t0; /* when the stager began (for its log line) */
    int pinning;    /* the stager is registering a piece of it: do not unmap */
    int pin_failed;
    int urgent; /* a swap needs its staging: the stager pins it before the others */
    int swapping; /* in a swap that may wait for the stager with mm_mu released: not to be freed */
    int picked; /* chosen for the eviction being planned */
    int vacant; /* freed with cuMemFreeAsync and kept: its bytes need no copy either way */
    uint64_t id;
    int slot; /* the shared GPU (dev.c) whose account counts it and whose scheduler swaps it */
    struct block *blk;
    int nblk, capblk, used;
    /* the application's own handle (cuMemCreate): its pages are mapped where the application
     * mapped them, never at va except while they are copied */
    int handle;
    int atva;     /* the pages are mapped at va (a swap in between copying and mapping back) */
    int app_refs; /* cuMemCreate and cuMemRetainAllocationHandle, less cuMemRelease */
    struct app_map *maps;
    int nmaps, capmaps;
};

/* One account per shared GPU (dev.c's slots): a process with oversubscription on several GPUs swaps
 * each GPU's regions against that GPU's budget, at that GPU's scheduler's word. MMD is the calling
 * thread's GPU's (gs_dev_cur); a region's is mm_devs[r->slot]. The regions themselves are one table
 * (device addresses are unique in the process) under one mutex, mm_mu. */
enum { MM_UNDECIDED, MM_ACTIVE, MM_OFF };
struct mm_dev {
    int state;
    uint64_t budget;
    uint32_t mode;
    /* read without mm_mu by the gate (ACQUIRE, RELEASE, pass-through) */
    _Atomic uint64_t need_bytes, resident_bytes, swapped_bytes, pending_growth;
    _Atomic uint64_t reserved;
    _Atomic uint32_t acks;
    uint64_t swap_outs, swap_ins, bytes_out, bytes_in, swap_ns;
    uint64_t overlapped; /* swap-ins that mapped memory as the previous holder's eviction freed it (RAISE) */
    uint64_t alloc_ns, allocs;
    /* MEMREPLY hand-over from the GPU's gate thread to the allocating thread (rep_mu is a leaf) */
    pthread_mutex_t rep_mu;
    pthread_cond_t rep_cv;
    uint64_t rep_seq;
    uint32_t rep_status;
    /* A MEMREQ waits for its MEMREPLY (mm_mu): one at a time per GPU, since the replies carry no
     * request id; another thread that needs more waits on memreq_cv (mm_mu released) and looks again. */
    int memreq_busy;
    pthread_cond_t memreq_cv;
    /* mm_async.c: the stream-ordered allocator's pool counters for this GPU's default pool */
    uint64_t live, kept_bytes, live_high, reserved_high;
};
extern struct mm_dev mm_devs[GS_DEV_SLOTS];
#define MMD (&mm_devs[gs_dev_cur])
/* Sends what GPU slot holds now (mm_report_locked as that GPU's, whichever the calling thread's is). */
void mm_report_slot_locked(int slot, uint32_t reason);

extern pthread_mutex_t mm_mu;
extern struct region **mm_regions; /* sorted by va */
extern int mm_nreg;
extern size_t mm_gran;
extern int mm_handles; /* regions that are application handles */

int mm_find_region_locked(CUdeviceptr p);
void mm_free_region_locked(int i);
/* A new resident region of `size` bytes (a multiple of mm_gran); prop NULL: plain device memory. */
CUresult mm_new_region_locked(size_t size, size_t user, int slab, const CUmemAllocationProp *prop,
                              struct region **out);
/* Makes sure `more` bytes beyond the working set fit the reservation (GS_MM_OK, GS_MM_YIELD or a CUDA error). */
int mm_reserve_locked(uint64_t more);
void mm_report_locked(uint32_t reason);
void mm_allocated_locked(uint64_t t0); /* after new pages: the scheduler hears of them */
int mm_exceeds_budget(const char *call, size_t n);
uint64_t mm_need_locked(void); /* the working set: every swappable byte, resident or not */
void mm_learn_granularity_locked(void);
/* Frees an allocation the application made; sync: wait for the context first (cuMemFree semantics). */
int mm_free_locked(CUdeviceptr d, int sync, CUresult *res);
void mm_sync_ctx(CUcontext ctx);
/* Frees made during a capture, done once none runs (mm_mu not held). */
void mm_flush_deferred(void);

/* mm_stage.c: host staging and the stager thread that page-locks it */
void mm_stage_init(void);                    /* once, before the first region */
void mm_stage_atfork_child(void);
void *mm_staging_map(size_t size);           /* MAP_FAILED when the host has no memory */
int mm_staging_fits(size_t size);            /* 0 when the host could not stage size bytes as one mapping */
void mm_stage_kick_locked(void);             /* staging to pin, or a swap made some urgent */
void mm_stage_wait_locked(struct region *r, size_t end); /* until pinned up to end (bounded) */
void mm_stage_wait_busy_locked(struct region *r);        /* until neither the stager nor a swap uses r */
void mm_stage_release_locked(struct region *r);          /* unregister and unmap r's staging */
void mm_stage_stats_locked(uint64_t *pinned, uint64_t *failures, uint64_t *waits, uint64_t *wait_ns);

/* mm_vmm.c: the application's mappings of a handle region */
void mm_vmm_detach_locked(struct region *r);   /* unmap the application's mappings (pages stay) */
CUresult mm_vmm_attach_locked(struct region *r); /* map the pages where the application mapped them */

/* mm_async.c: freed stream-ordered memory kept for reuse */
int mm_async_cached_locked(CUdeviceptr d);       /* 1 if d was freed with cuMemFreeAsync and is kept */
/* Frees kept memory until the working set shrank by goal bytes (UINT64_MAX: all of it);
 * wait: also memory the GPU may still use (after waiting for it). Returns the bytes it shrank by. */
uint64_t mm_async_drop_locked(int wait, uint64_t goal);
void mm_async_stats_locked(uint64_t *reused, uint64_t *fresh, uint64_t *passed);
void mm_async_atfork_child(void);

#endif
