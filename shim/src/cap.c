/*
 * The memory limit (GPUSHARE_MEMORY_LIMIT_BYTES): the most device memory this process may hold
 * allocated, whatever the allocation path, with or without oversubscription.
 *
 * One atomic counter holds the bytes charged. An allocation charges its size before the driver (or
 * the memory manager) is asked, with a compare-and-swap that refuses to pass the limit, so two
 * threads can never both take the last bytes; a failed allocation gives them back. A successful one
 * is remembered in a table (pointer or handle -> bytes) so that its free gives back exactly what it
 * charged; frees of memory the table does not know (made before the limit could see them, or by
 * another path) change nothing. The table has its own mutex, held for a lookup only, never across
 * a driver call: the memory manager's mm_mu is held across swaps and scheduler waits, and a limit
 * check must not queue behind those.
 *
 * With no limit configured none of this runs: each entry point tests gs_cfg.memory_limit (read once
 * at start-up) and goes on as before.
 */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

struct cap_entry {
    uint64_t key;  /* 0: empty slot */
    uint64_t bytes;
    uint32_t kind; /* GS_CAP_PTR or GS_CAP_HANDLE: a handle's value may equal some pointer's */
    uint32_t refs; /* handles: cuMemCreate and cuMemRetainAllocationHandle, less cuMemRelease */
};

static _Atomic uint64_t charged;
static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cap_entry *tab;
static size_t tab_cap, tab_len; /* tab_cap a power of two; at most half full */

uint64_t gs_cap_used(void)
{
    return atomic_load_explicit(&charged, memory_order_relaxed);
}

CUresult gs_cap_charge(uint64_t n)
{
    uint64_t lim = gs_cfg.memory_limit;
    uint64_t cur = atomic_load_explicit(&charged, memory_order_relaxed);
    do {
        if (n > lim || cur > lim - n) {
            static atomic_int warned;
            gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
                   "out of memory: %llu bytes more would pass this process's memory limit of %llu bytes "
                   "(GPUSHARE_MEMORY_LIMIT_BYTES; %llu allocated)",
                   (unsigned long long)n, (unsigned long long)lim, (unsigned long long)cur);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } while (!atomic_compare_exchange_weak_explicit(&charged, &cur, cur + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return CUDA_SUCCESS;
}

void gs_cap_uncharge(uint64_t n)
{
    atomic_fetch_sub_explicit(&charged, n, memory_order_relaxed);
}

static size_t slot_of(uint64_t key, uint32_t kind)
{
    uint64_t h = (key ^ ((uint64_t)kind << 63)) * 0x9e3779b97f4a7c15ull; /* Fibonacci hashing */
    return (size_t)(h >> 32) & (tab_cap - 1);
}

static size_t find_locked(uint64_t key, uint32_t kind)
{
    if (tab_cap == 0)
        return SIZE_MAX;
    for (size_t i = slot_of(key, kind);; i = (i + 1) & (tab_cap - 1)) {
        if (tab[i].key == 0)
            return SIZE_MAX;
        if (tab[i].key == key && tab[i].kind == kind)
            return i;
    }
}

static void put_locked(struct cap_entry e)
{
    size_t i = slot_of(e.key, e.kind);
    while (tab[i].key != 0)
        i = (i + 1) & (tab_cap - 1);
    tab[i] = e;
    tab_len++;
}

static int grow_locked(void)
{
    size_t ncap = tab_cap ? tab_cap * 2 : 1024;
    struct cap_entry *old = tab, *nt = calloc(ncap, sizeof(*nt));
    size_t ocap = tab_cap;
    if (nt == NULL)
        return -1;
    tab = nt;
    tab_cap = ncap;
    tab_len = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].key != 0)
            put_locked(old[i]);
    free(old);
    return 0;
}

/* Linear probing without tombstones: the entries after the hole move back where their probe allows. */
static void remove_at_locked(size_t i)
{
    tab[i].key = 0;
    tab_len--;
    for (size_t j = (i + 1) & (tab_cap - 1); tab[j].key != 0; j = (j + 1) & (tab_cap - 1)) {
        struct cap_entry e = tab[j];
        tab[j].key = 0;
        tab_len--;
        put_locked(e);
    }
}

void gs_cap_track(uint32_t kind, uint64_t key, uint64_t bytes)
{
    pthread_mutex_lock(&tab_mu);
    int ok = key != 0 && ((tab_len + 1) * 2 <= tab_cap || grow_locked() == 0);
    if (ok)
        put_locked((struct cap_entry){.key = key, .bytes = bytes, .kind = kind, .refs = 1});
    pthread_mutex_unlock(&tab_mu);
    if (!ok) {
        /* Without an entry its free could not give the bytes back: leave this one uncounted. */
        gs_cap_uncharge(bytes);
        static atomic_int warned;
        gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
               "memory limit: no host memory to remember an allocation of %llu bytes; it is not counted",
               (unsigned long long)bytes);
    }
}

int gs_cap_retain(uint32_t kind, uint64_t key)
{
    pthread_mutex_lock(&tab_mu);
    size_t i = find_locked(key, kind);
    if (i != SIZE_MAX)
        tab[i].refs++;
    pthread_mutex_unlock(&tab_mu);
    return i != SIZE_MAX;
}

/* A mapping is one more reference to its handle's entry (the handle's bytes stay charged while it lives),
 * remembered by its address (kind GS_CAP_MAP, bytes: the handle) for cuMemUnmap, which names addresses. */
void gs_cap_map(CUdeviceptr va, uint64_t handle)
{
    pthread_mutex_lock(&tab_mu);
    size_t i = find_locked(handle, GS_CAP_HANDLE);
    if (i != SIZE_MAX && va != 0 && find_locked(va, GS_CAP_MAP) == SIZE_MAX &&
        ((tab_len + 1) * 2 <= tab_cap || grow_locked() == 0)) {
        i = find_locked(handle, GS_CAP_HANDLE); /* grow moved it */
        tab[i].refs++;
        put_locked((struct cap_entry){.key = va, .bytes = handle, .kind = GS_CAP_MAP, .refs = 1});
    }
    pthread_mutex_unlock(&tab_mu);
}

/* Drops one reference of handle's entry; returns the bytes to give back when it was the last. tab_mu held. */
static uint64_t unref_locked(uint64_t handle)
{
    size_t i = find_locked(handle, GS_CAP_HANDLE);
    if (i == SIZE_MAX)
        return 0;
    if (--tab[i].refs > 0)
        return 0;
    uint64_t b = tab[i].bytes;
    remove_at_locked(i);
    return b;
}

void gs_cap_unmap(CUdeviceptr va, size_t size)
{
    uint64_t back = 0;
    pthread_mutex_lock(&tab_mu);
    size_t i = find_locked(va, GS_CAP_MAP);
    if (i != SIZE_MAX) {
        /* the usual case: one mapping unmapped where it starts */
        uint64_t h = tab[i].bytes;
        remove_at_locked(i);
        back += unref_locked(h);
    }
    if (size > 0 && tab_cap > 0) {
        /* a range over several mappings (vectorAddMMAP unmaps its whole range at once): every mapping that
         * starts inside it; rare, so a scan. A removal moves entries, so the scan starts again after one. */
        for (size_t j = 0; j < tab_cap; j++) {
            if (tab[j].key != 0 && tab[j].kind == GS_CAP_MAP && tab[j].key > va && tab[j].key - va < size) {
                uint64_t h = tab[j].bytes;
                remove_at_locked(j);
                back += unref_locked(h);
                j = (size_t)-1;
            }
        }
    }
    pthread_mutex_unlock(&tab_mu);
    if (back > 0)
        gs_cap_uncharge(back);
}

int gs_cap_free_begin(uint32_t kind, uint64_t key, struct gs_cap_free *f)
{
    f->kind = kind;
    f->key = key;
    f->bytes = 0;
    f->refs = 0;
    pthread_mutex_lock(&tab_mu);
    size_t i = find_locked(key, kind);
    if (i != SIZE_MAX) {
        f->bytes = tab[i].bytes;
        f->refs = tab[i].refs;
        if (f->refs > 1)
            tab[i].refs--; /* a handle still retained: its pages stay, and so does the charge */
        else
            remove_at_locked(i); /* before the driver frees it, so that a new allocation may reuse the address */
    }
    pthread_mutex_unlock(&tab_mu);
    return i != SIZE_MAX;
}

void gs_cap_free_end(const struct gs_cap_free *f, CUresult r)
{
    if (f->refs == 0)
        return; /* not ours to count */
    if (r != CUDA_SUCCESS) {
        /* The driver refused the free: the memory is still allocated, and still charged. */
        pthread_mutex_lock(&tab_mu);
        size_t i = find_locked(f->key, f->kind);
        if (i != SIZE_MAX)
            tab[i].refs++;
        pthread_mutex_unlock(&tab_mu);
        if (i == SIZE_MAX)
            gs_cap_track(f->kind, f->key, f->bytes); /* the charge is still held: track gives it back on failure */
        return;
    }
    if (f->refs == 1)
        gs_cap_uncharge(f->bytes);
}

void gs_cap_report(uint64_t drv_total, uint64_t drv_free, uint64_t *total, uint64_t *free_)
{
    uint64_t lim = gs_cfg.memory_limit, used = gs_cap_used();
    uint64_t room = used < lim ? lim - used : 0;
    *total = lim < drv_total ? lim : drv_total;
    *free_ = room < drv_free ? room : drv_free;
}

void gs_cap_atfork_child(void)
{
    /* CUDA does not survive fork: the child starts with nothing allocated. The mutex may have been
     * held by another thread of the parent. */
    pthread_mutex_init(&tab_mu, NULL);
    free(tab);
    tab = NULL;
    tab_cap = tab_len = 0;
    atomic_store(&charged, 0);
}
