/*
 * The application's own virtual memory management, swappable
 * (PyTorch's expandable_segments:True, and any library that maps its own
 * cuMemCreate handles).
 *
 * With oversubscription on, cuMemCreate of device memory gives the
 * application a handle of ours: a region of the memory manager whose value is
 * the address of a private range we reserved for it (no driver handle can
 * have that value). The region owns the real physical allocation; we record
 * where the application maps it (cuMemMap) and who may access it there
 * (cuMemSetAccess). Swapping out unmaps those mappings, maps the pages at the
 * private range, copies them out and releases them; swapping in creates new
 * pages, copies in through the private range and maps them back where the
 * application had them, with the same access. A physical allocation is
 * mapped in one place at a time, so a swap never depends on aliasing.
 *
 * The application's addresses never change, and its calls only ever run with
 * the GPU held (the gate), when every region is resident. cuMemRelease of a
 * mapped handle keeps the memory until its last mapping goes, as the driver
 * does. Handles of other kinds (host memory, imported, created before
 * oversubscription was on) are the driver's and pass through.
 */
#include <stdlib.h>
#include <string.h>

#include "gpushare_proto.h"
#include "mm_internal.h"

#define REAL_OR_FAIL(name)                                                                         \
    gs_fn_##name real = (gs_fn_##name)gs_real(GS_ID_##name);                                       \
    if (GS_UNLIKELY(real == NULL))                                                                 \
        return CUDA_ERROR_NOT_INITIALIZED;

static int any_handles(void)
{
    return __atomic_load_n(&mm_handles, __ATOMIC_RELAXED) > 0;
}

/* Our region behind a handle value, or NULL for a driver handle. */
static struct region *handle_region_locked(CUmemGenericAllocationHandle h)
{
    if (mm_handles == 0)
        return NULL;
    int i = mm_find_region_locked((CUdeviceptr)h);
    if (i < 0 || !mm_regions[i]->handle || mm_regions[i]->va != (CUdeviceptr)h)
        return NULL;
    return mm_regions[i];
}

/* The region and mapping the application address p lies in, or NULL. */
static struct region *mapped_at_locked(CUdeviceptr p, int *mi)
{
    for (int i = 0; mm_handles > 0 && i < mm_nreg; i++) {
        struct region *r = mm_regions[i];
        for (int k = 0; r->handle && k < r->nmaps; k++)
            if (p >= r->maps[k].va && p < r->maps[k].va + r->maps[k].size) {
                *mi = k;
                return r;
            }
    }
    return NULL;
}

int gs_mm_vmm_mapped(CUdeviceptr p)
{
    if (!any_handles())
        return 0;
    pthread_mutex_lock(&mm_mu);
    int k;
    int found = mapped_at_locked(p, &k) != NULL;
    pthread_mutex_unlock(&mm_mu);
    return found;
}

int gs_mm_handle_slot(uint64_t h)
{
    if (!any_handles())
        return GS_DEV_NONE;
    pthread_mutex_lock(&mm_mu);
    struct region *r = handle_region_locked(h);
    int slot = r != NULL ? r->slot : GS_DEV_NONE;
    pthread_mutex_unlock(&mm_mu);
    return slot;
}

int gs_mm_va_slot(CUdeviceptr p)
{
    if (!any_handles())
        return GS_DEV_NONE;
    pthread_mutex_lock(&mm_mu);
    int k;
    struct region *r = mapped_at_locked(p, &k);
    int slot = r != NULL ? r->slot : GS_DEV_NONE;
    pthread_mutex_unlock(&mm_mu);
    return slot;
}

void mm_vmm_detach_locked(struct region *r)
{
    for (int k = 0; k < r->nmaps; k++)
        REAL(cuMemUnmap)(r->maps[k].va, r->maps[k].size);
}

CUresult mm_vmm_attach_locked(struct region *r)
{
    CUresult first = CUDA_SUCCESS;
    for (int k = 0; k < r->nmaps; k++) {
        struct app_map *m = &r->maps[k];
        CUresult e = REAL(cuMemMap)(m->va, m->size, m->off, r->h, 0);
        if (e == CUDA_SUCCESS && m->nacc > 0)
            e = REAL(cuMemSetAccess)(m->va, m->size, m->acc, (size_t)m->nacc);
        if (e != CUDA_SUCCESS && first == CUDA_SUCCESS)
            first = e;
    }
    return first;
}

/* Frees the region once the application neither holds its handle nor maps it. */
static void release_if_unused_locked(struct region *r)
{
    if (r->app_refs > 0 || r->nmaps > 0)
        return;
    int slot = r->slot; /* its GPU's scheduler hears of it, whichever GPU's call released it */
    mm_free_region_locked(mm_find_region_locked(r->va));
    mm_report_slot_locked(slot, GS_USAGE_REPORT);
}

static int swappable(const CUmemAllocationProp *prop, unsigned long long flags)
{
    return prop != NULL && flags == 0 && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
}

static CUresult create_locked(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                              int *yield)
{
    uint64_t t0 = gs_now_ns();
    mm_learn_granularity_locked();
    if (size == 0 || size % mm_gran != 0)
        return CUDA_ERROR_INVALID_VALUE; /* what the driver says to a size off the granularity */
    if (mm_exceeds_budget("cuMemCreate", size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int rr = mm_reserve_locked(size);
    if (rr != GS_MM_OK) {
        *yield = rr == GS_MM_YIELD;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct region *r;
    CUresult e = mm_new_region_locked(size, size, 0, prop, &r);
    if (e == CUDA_SUCCESS) {
        r->app_refs = 1;
        *handle = (CUmemGenericAllocationHandle)r->va;
    }
    mm_allocated_locked(t0);
    return e;
}

static CUresult create(gs_fn_cuMemCreate real, CUmemGenericAllocationHandle *handle, size_t size,
                       const CUmemAllocationProp *prop, unsigned long long flags)
{
    for (;;) {
        int gd = gs_gate_enter(GS_ID_cuMemCreate);
        if (!gs_mm_here() || handle == NULL || !swappable(prop, flags)) {
            CUresult r = real(handle, size, prop, flags);
            gs_gate_leave(gd);
            return r;
        }
        int yield = 0;
        pthread_mutex_lock(&mm_mu);
        CUresult r = create_locked(handle, size, prop, &yield);
        pthread_mutex_unlock(&mm_mu);
        gs_gate_leave(gd);
        if (!yield)
            return r;
        gs_gate_yield(); /* others hold the memory: give the GPU back, wait in line with the larger need */
    }
}

/* The memory limit charges a device handle's size (a multiple of the granularity: what the driver
 * takes) from cuMemCreate until its last cuMemRelease; mapping it costs nothing more. */
GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    gs_dev_pick_prop(prop);
    REAL_OR_FAIL(cuMemCreate)
    if (GS_LIKELY(!gs_cap_on()) || handle == NULL || size == 0 || prop == NULL ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return create(real, handle, size, prop, flags);
    CUresult r = gs_cap_charge(size);
    if (r != CUDA_SUCCESS)
        return r;
    r = create(real, handle, size, prop, flags);
    gs_cap_done(r, GS_CAP_HANDLE, r == CUDA_SUCCESS ? *handle : 0, size);
    return r;
}

static CUresult release(gs_fn_cuMemRelease real, CUmemGenericAllocationHandle h);

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    gs_dev_pick_handle(h);
    REAL_OR_FAIL(cuMemRelease)
    if (GS_LIKELY(!gs_cap_on()))
        return release(real, h);
    struct gs_cap_free f;
    gs_cap_free_begin(GS_CAP_HANDLE, h, &f);
    CUresult r = release(real, h);
    gs_cap_free_end(&f, r);
    return r;
}

static CUresult release(gs_fn_cuMemRelease real, CUmemGenericAllocationHandle h)
{
    if (!any_handles())
        return real(h);
    pthread_mutex_lock(&mm_mu);
    struct region *r = handle_region_locked(h);
    CUresult e = CUDA_SUCCESS;
    if (r == NULL)
        e = real(h);
    else if (r->app_refs <= 0)
        e = CUDA_ERROR_INVALID_VALUE; /* released more often than created and retained */
    else {
        r->app_refs--;
        release_if_unused_locked(r);
    }
    pthread_mutex_unlock(&mm_mu);
    return e;
}

static CUresult map(gs_fn_cuMemMap real, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                    unsigned long long flags);

/* A mapping holds its handle's pages, and so its charge, until it is unmapped: cuMemRelease of a mapped
 * handle (vectorAddMMAP's pattern: create, map, release at once) frees nothing yet. A handle the limit
 * does not count (imported from another process, or made where the shim could not see) is charged the
 * size mapped before the driver maps it (a VMM mapping covers its whole handle), and refused with out of
 * memory past the limit. */
GS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                            unsigned long long flags)
{
    gs_dev_pick_handle(h);
    REAL_OR_FAIL(cuMemMap)
    if (GS_LIKELY(!gs_cap_on()))
        return map(real, ptr, size, offset, h, flags);
    uint64_t own = 0;
    if (h != 0 && size != 0 && !gs_cap_known(GS_CAP_HANDLE, h)) {
        own = gs_cap_size(size);
        CUresult r = gs_cap_charge(own);
        if (r != CUDA_SUCCESS)
            return r;
    }
    CUresult r = map(real, ptr, size, offset, h, flags);
    uint64_t back = r == CUDA_SUCCESS ? gs_cap_map(ptr, h, own) : own;
    if (back > 0)
        gs_cap_uncharge(back);
    return r;
}

static CUresult map(gs_fn_cuMemMap real, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                    unsigned long long flags)
{
    if (!any_handles())
        return real(ptr, size, offset, h, flags);
    int gd = gs_gate_enter(GS_ID_cuMemMap); /* the pages are resident while we hold the GPU */
    pthread_mutex_lock(&mm_mu);
    struct region *r = handle_region_locked(h);
    CUresult e;
    if (r == NULL) {
        e = real(ptr, size, offset, h, flags);
    } else if (r->nmaps == r->capmaps && r->capmaps >= 1024) {
        e = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        if (r->nmaps == r->capmaps) {
            int cap = r->capmaps ? r->capmaps * 2 : 2;
            struct app_map *n = realloc(r->maps, (size_t)cap * sizeof(*n));
            if (n != NULL) {
                r->maps = n;
                r->capmaps = cap;
            }
        }
        e = r->nmaps < r->capmaps ? real(ptr, size, offset, r->h, flags) : CUDA_ERROR_OUT_OF_MEMORY;
        if (e == CUDA_SUCCESS)
            r->maps[r->nmaps++] = (struct app_map){.va = ptr, .size = size, .off = offset};
    }
    pthread_mutex_unlock(&mm_mu);
    gs_gate_leave(gd);
    return e;
}

static void remove_map_locked(struct region *r, int k)
{
    memmove(&r->maps[k], &r->maps[k + 1], (size_t)(r->nmaps - k - 1) * sizeof(*r->maps));
    r->nmaps--;
}

/* Unmaps [ptr, ptr+size): our mappings one by one, the driver's (gaps between ours) as they are. */
static CUresult unmap_range_locked(gs_fn_cuMemUnmap real, CUdeviceptr ptr, size_t size)
{
    CUdeviceptr at = ptr, end = ptr + size;
    CUresult first = CUDA_SUCCESS;
    while (at < end) {
        /* the lowest mapping of ours that starts in [at, end) */
        struct region *best = NULL;
        int bk = -1;
        for (int i = 0; i < mm_nreg; i++) {
            struct region *r = mm_regions[i];
            for (int k = 0; r->handle && k < r->nmaps; k++) {
                struct app_map *m = &r->maps[k];
                if (m->va < at && m->va + m->size > at)
                    return CUDA_ERROR_INVALID_VALUE; /* would split one of our mappings */
                if (m->va >= at && m->va < end && (best == NULL || m->va < best->maps[bk].va)) {
                    best = r;
                    bk = k;
                }
            }
        }
        if (best == NULL) {
            CUresult e = real(at, (size_t)(end - at));
            return first != CUDA_SUCCESS ? first : e;
        }
        struct app_map m = best->maps[bk];
        if (m.va + m.size > end)
            return CUDA_ERROR_INVALID_VALUE;
        if (m.va > at) {
            CUresult e = real(at, (size_t)(m.va - at));
            if (e != CUDA_SUCCESS && first == CUDA_SUCCESS)
                first = e;
        }
        CUresult e = real(m.va, m.size);
        if (e != CUDA_SUCCESS)
            return e;
        remove_map_locked(best, bk);
        release_if_unused_locked(best);
        at = m.va + m.size;
    }
    return first;
}

static CUresult unmap(gs_fn_cuMemUnmap real, CUdeviceptr ptr, size_t size);

GS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    gs_dev_pick_va(ptr);
    REAL_OR_FAIL(cuMemUnmap)
    CUresult r = unmap(real, ptr, size);
    if (gs_cap_on() && r == CUDA_SUCCESS)
        gs_cap_unmap(ptr, size);
    return r;
}

static CUresult unmap(gs_fn_cuMemUnmap real, CUdeviceptr ptr, size_t size)
{
    if (!any_handles())
        return real(ptr, size);
    int gd = gs_gate_enter(GS_ID_cuMemUnmap);
    pthread_mutex_lock(&mm_mu);
    CUresult e = unmap_range_locked(real, ptr, size);
    pthread_mutex_unlock(&mm_mu);
    gs_gate_leave(gd);
    return e;
}

/* Remembers the access the application gave a mapping, to give it again after a swap. */
static void record_access(struct app_map *m, const CUmemAccessDesc *desc, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int k;
        for (k = 0; k < m->nacc; k++)
            if (m->acc[k].location.type == desc[i].location.type && m->acc[k].location.id == desc[i].location.id)
                break;
        if (k == m->nacc) {
            if (m->nacc == MM_MAX_ACCESS)
                continue;
            m->nacc++;
        }
        m->acc[k] = desc[i];
    }
}

GS_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    gs_dev_pick_va(ptr);
    REAL_OR_FAIL(cuMemSetAccess)
    if (!any_handles())
        return real(ptr, size, desc, count);
    int gd = gs_gate_enter(GS_ID_cuMemSetAccess);
    pthread_mutex_lock(&mm_mu);
    CUresult e = real(ptr, size, desc, count);
    /* Access is kept per mapping: a call over part of one is remembered for all of it. */
    for (int i = 0; e == CUDA_SUCCESS && desc != NULL && i < mm_nreg; i++) {
        struct region *r = mm_regions[i];
        for (int k = 0; r->handle && k < r->nmaps; k++)
            if (r->maps[k].va < ptr + size && r->maps[k].va + r->maps[k].size > ptr)
                record_access(&r->maps[k], desc, count);
    }
    pthread_mutex_unlock(&mm_mu);
    gs_gate_leave(gd);
    return e;
}

GS_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    gs_dev_pick_va(ptr);
    REAL_OR_FAIL(cuMemGetAccess)
    if (!gs_mm_vmm_mapped(ptr))
        return real(flags, location, ptr);
    int gd = gs_gate_enter(GS_ID_cuMemGetAccess); /* swapped-out memory is mapped again first */
    CUresult e = real(flags, location, ptr);
    gs_gate_leave(gd);
    return e;
}

static CUresult retain(gs_fn_cuMemRetainAllocationHandle real, CUmemGenericAllocationHandle *handle, void *addr);

/* A retained handle needs one more cuMemRelease before its pages, and its charge, go. A driver that
 * answers with a handle value of its own (not the mapped handle's) gets an entry sharing the mapped
 * handle's charge. */
GS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    gs_dev_pick_va((CUdeviceptr)(uintptr_t)addr);
    REAL_OR_FAIL(cuMemRetainAllocationHandle)
    CUresult r = retain(real, handle, addr);
    if (gs_cap_on() && r == CUDA_SUCCESS && handle != NULL && !gs_cap_retain(GS_CAP_HANDLE, *handle))
        gs_cap_retained_at((CUdeviceptr)(uintptr_t)addr, *handle);
    return r;
}

static CUresult retain(gs_fn_cuMemRetainAllocationHandle real, CUmemGenericAllocationHandle *handle, void *addr)
{
    if (!any_handles() || handle == NULL)
        return real(handle, addr);
    pthread_mutex_lock(&mm_mu);
    int k;
    struct region *r = mapped_at_locked((CUdeviceptr)(uintptr_t)addr, &k);
    if (r != NULL) {
        r->app_refs++;
        *handle = (CUmemGenericAllocationHandle)r->va;
    }
    pthread_mutex_unlock(&mm_mu);
    return r != NULL ? CUDA_SUCCESS : real(handle, addr);
}

GS_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
    gs_dev_pick_handle(h);
    REAL_OR_FAIL(cuMemGetAllocationPropertiesFromHandle)
    if (!any_handles() || prop == NULL)
        return real(prop, h);
    pthread_mutex_lock(&mm_mu);
    struct region *r = handle_region_locked(h);
    if (r != NULL)
        *prop = r->prop;
    pthread_mutex_unlock(&mm_mu);
    return r != NULL ? CUDA_SUCCESS : real(prop, h);
}

GS_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
                                                unsigned long long flags)
{
    gs_dev_pick_handle(h);
    REAL_OR_FAIL(cuMemExportToShareableHandle)
    int ours = 0;
    if (any_handles()) {
        pthread_mutex_lock(&mm_mu);
        ours = handle_region_locked(h) != NULL;
        pthread_mutex_unlock(&mm_mu);
    }
    if (!ours) {
        CUresult r = real(shareable, h, type, flags);
        if (gs_cap_on() && r == CUDA_SUCCESS)
            gs_cap_exported(type, shareable, h);
        return r;
    }
    static atomic_int warned;
    gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
           "cuMemExportToShareableHandle: not supported on swappable memory (another process would keep "
           "pages this one swaps out; e.g. torch.multiprocessing sharing CUDA tensors with "
           "expandable_segments). Run this process with GPUSHARE_OVERSUB=0 to share it");
    return CUDA_ERROR_NOT_SUPPORTED;
}


/* An import of this process's own export shares the original's charge (cap.c); another process's
 * memory is charged where it is mapped. */
GS_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                  CUmemAllocationHandleType type)
{
    gs_dev_pick();
    REAL_OR_FAIL(cuMemImportFromShareableHandle)
    CUresult r = real(handle, os_handle, type);
    if (gs_cap_on() && r == CUDA_SUCCESS && handle != NULL)
        gs_cap_imported(type, os_handle, *handle);
    return r;
}
