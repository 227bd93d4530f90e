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
#include <string.h>
#include <time.h>

#include "gpushare_proto.h"

#include "internal.h"

struct cap_entry {
    uint64_t key;  /* 0: empty slot */
    uint64_t bytes;
    uint32_t kind; /* GS_CAP_*: a handle's value may equal some pointer's */
    uint32_t refs; /* handles: cuMemCreate, cuMemRetainAllocationHandle and mappings, less cuMemRelease */
    /* handles: the handle whose charge this one shares (an import of this process's own export: the same
     * memory), held by one reference while this entry lives; 0: none */
    uint64_t parent;
    /* handles: the references that are not the application's (its mappings, the handles sharing its
     * charge); when only those are left the application has released the handle and its value is the
     * driver's to give again, so the entry moves to a key of its own (ghost_locked) */
    uint32_t held;
};

/* One limit, table and ledger per shared GPU (dev.c); C is the calling thread's GPU's. */
struct cap_dev {
    _Atomic uint64_t charged;
    pthread_mutex_t tab_mu;
    struct cap_entry *tab;
    size_t tab_cap, tab_len; /* tab_cap a power of two; at most half full */
    /* the claim's ledger (below) */
    pthread_rwlock_t led_rw;
    atomic_int led_on;
    atomic_int led_away; /* led_on, and the connection ended: nothing past what is charged until the next one */
    atomic_int away_gave_up; /* led_away, and an allocation waited its whole timeout for the next connection */
    _Atomic int64_t room;
    /* charged to the limit by allocations still asking the scheduler (ledger_more): not granted yet, so a
     * new connection's Hold leaves them out */
    _Atomic uint64_t asking;
    _Atomic uint64_t led_total, led_others, led_chunk;
    struct gs_ledger offered; /* the connection's LEDGER, read with its WELCOME (under the gate's mutex) */
    int offered_set;
    atomic_int led_refused; /* this connection's LEDGER said REFUSED and this process has no context */
    atomic_int ctx_made;    /* a context creation succeeded: a new connection announces it */
    pthread_mutex_t req_mu; /* one CHARGE or RETURN at a time */
    pthread_mutex_t rep_mu;
    pthread_cond_t rep_cv;
    pthread_once_t rep_once;
    uint32_t req_seq, rep_seq, rep_status;
    atomic_int connect_asked;
    _Atomic uint64_t gran; /* the driver's allocation granularity (0: not asked yet) */
    uint64_t ghosts;       /* keys given to released handles' entries (GS_CAP_GHOST) */
    pthread_mutex_t heap_mu;
    uint64_t heap; /* the device malloc heap charged (cuCtxSetLimit) */
};
static struct cap_dev caps[GS_DEV_SLOTS] = {
    [0 ... GS_DEV_SLOTS - 1] = {.tab_mu = PTHREAD_MUTEX_INITIALIZER,
                                .led_rw = PTHREAD_RWLOCK_INITIALIZER,
                                .req_mu = PTHREAD_MUTEX_INITIALIZER,
                                .rep_mu = PTHREAD_MUTEX_INITIALIZER,
                                .heap_mu = PTHREAD_MUTEX_INITIALIZER,
                                .rep_once = PTHREAD_ONCE_INIT},
};
#define C (&caps[gs_dev_cur])
int gs_cap_any;

uint64_t gs_cap_used(void)
{
    return atomic_load_explicit(&C->charged, memory_order_relaxed);
}

static size_t slot_of(uint64_t key, uint32_t kind)
{
    uint64_t h = (key ^ ((uint64_t)kind << 63)) * 0x9e3779b97f4a7c15ull; /* Fibonacci hashing */
    return (size_t)(h >> 32) & (C->tab_cap - 1);
}

static size_t find_locked(uint64_t key, uint32_t kind)
{
    if (C->tab_cap == 0)
        return SIZE_MAX;
    for (size_t i = slot_of(key, kind);; i = (i + 1) & (C->tab_cap - 1)) {
        if (C->tab[i].key == 0)
            return SIZE_MAX;
        if (C->tab[i].key == key && C->tab[i].kind == kind)
            return i;
    }
}

static void put_locked(struct cap_entry e)
{
    size_t i = slot_of(e.key, e.kind);
    while (C->tab[i].key != 0)
        i = (i + 1) & (C->tab_cap - 1);
    C->tab[i] = e;
    C->tab_len++;
}

static int grow_locked(void)
{
    size_t ncap = C->tab_cap ? C->tab_cap * 2 : 1024;
    struct cap_entry *old = C->tab, *nt = calloc(ncap, sizeof(*nt));
    size_t ocap = C->tab_cap;
    if (nt == NULL)
        return -1;
    C->tab = nt;
    C->tab_cap = ncap;
    C->tab_len = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].key != 0)
            put_locked(old[i]);
    free(old);
    return 0;
}

/* Linear probing without tombstones: the entries after the hole move back where their probe allows. */
static void remove_at_locked(size_t i)
{
    C->tab[i].key = 0;
    C->tab_len--;
    for (size_t j = (i + 1) & (C->tab_cap - 1); C->tab[j].key != 0; j = (j + 1) & (C->tab_cap - 1)) {
        struct cap_entry e = C->tab[j];
        C->tab[j].key = 0;
        C->tab_len--;
        put_locked(e);
    }
}

void gs_cap_track(uint32_t kind, uint64_t key, uint64_t bytes)
{
    pthread_mutex_lock(&C->tab_mu);
    int ok = key != 0 && ((C->tab_len + 1) * 2 <= C->tab_cap || grow_locked() == 0);
    if (ok)
        put_locked((struct cap_entry){.key = key, .bytes = bytes, .kind = kind, .refs = 1});
    pthread_mutex_unlock(&C->tab_mu);
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
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(key, kind);
    if (i != SIZE_MAX)
        C->tab[i].refs++;
    pthread_mutex_unlock(&C->tab_mu);
    return i != SIZE_MAX;
}

int gs_cap_known(uint32_t kind, uint64_t key)
{
    pthread_mutex_lock(&C->tab_mu);
    int found = find_locked(key, kind) != SIZE_MAX;
    pthread_mutex_unlock(&C->tab_mu);
    return found;
}

static int room_for_locked(size_t more)
{
    return (C->tab_len + more) * 2 <= C->tab_cap || grow_locked() == 0;
}

/* The entry a stored reference (a mapping's handle, a parent, an export's handle) names: a handle the
 * application holds, or one it released while something else still holds it (a ghost key, top bit set). */
#define GHOST_BIT (1ull << 63)
static size_t find_ref_locked(uint64_t key)
{
    return find_locked(key, (key & GHOST_BIT) ? GS_CAP_GHOST : GS_CAP_HANDLE);
}

/* Entry i's handle was released by the application while mappings or sharing handles still hold it:
 * the driver may give its value to a new allocation, which must find no entry under it. The entry moves
 * to a key no handle has, and every reference to it (mappings, sharing handles, exports) follows. */
static void ghost_locked(size_t i)
{
    struct cap_entry e = C->tab[i];
    uint64_t old = e.key;
    e.key = GHOST_BIT | ++C->ghosts;
    e.kind = GS_CAP_GHOST;
    remove_at_locked(i);
    put_locked(e); /* the slot just freed: no growth needed */
    for (size_t j = 0; j < C->tab_cap; j++) {
        struct cap_entry *x = &C->tab[j];
        if (x->key == 0)
            continue;
        if ((x->kind == GS_CAP_MAP || x->kind == GS_CAP_EXPORT) && x->bytes == old)
            x->bytes = e.key;
        else if ((x->kind == GS_CAP_HANDLE || x->kind == GS_CAP_GHOST) && x->parent == old)
            x->parent = e.key;
    }
}

/* A mapping is one more reference to its handle's entry (the handle's bytes stay charged while it lives),
 * remembered by its address (kind GS_CAP_MAP, bytes: the handle) for cuMemUnmap, which names addresses.
 * own > 0: the handle is one the table did not know (imported from another process, or made by a path the
 * shim does not see), charged own bytes by the caller: its entry starts with the application's reference
 * to the handle and this mapping's, so that neither its cuMemRelease nor its cuMemUnmap alone gives the
 * bytes back. Returns the bytes of own the table could not hold, for the caller to give back. */
uint64_t gs_cap_map(CUdeviceptr va, uint64_t handle, uint64_t own)
{
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(handle, GS_CAP_HANDLE);
    uint64_t back = own;
    if (i == SIZE_MAX && own > 0 && handle != 0 && room_for_locked(1)) {
        put_locked((struct cap_entry){.key = handle, .bytes = own, .kind = GS_CAP_HANDLE, .refs = 1});
        i = find_locked(handle, GS_CAP_HANDLE);
        back = 0;
    }
    if (i != SIZE_MAX && va != 0 && find_locked(va, GS_CAP_MAP) == SIZE_MAX && room_for_locked(1)) {
        i = find_locked(handle, GS_CAP_HANDLE); /* grow moved it */
        C->tab[i].refs++;
        C->tab[i].held++;
        put_locked((struct cap_entry){.key = va, .bytes = handle, .kind = GS_CAP_MAP, .refs = 1});
    }
    pthread_mutex_unlock(&C->tab_mu);
    return back;
}

/* cuMemRetainAllocationHandle gave handle for the mapping at va, a value the table does not count: it is
 * the mapped handle's memory, so it shares that handle's charge as an import of an own export does. */
void gs_cap_retained_at(CUdeviceptr va, uint64_t handle)
{
    pthread_mutex_lock(&C->tab_mu);
    size_t m = find_locked(va, GS_CAP_MAP);
    uint64_t orig = m != SIZE_MAX ? C->tab[m].bytes : 0;
    if (orig != 0 && handle != 0 && find_locked(handle, GS_CAP_HANDLE) == SIZE_MAX &&
        find_ref_locked(orig) != SIZE_MAX && room_for_locked(1)) {
        size_t o = find_ref_locked(orig);
        C->tab[o].refs++;
        C->tab[o].held++;
        put_locked((struct cap_entry){.key = handle, .bytes = 0, .kind = GS_CAP_HANDLE, .refs = 1, .parent = orig});
    }
    pthread_mutex_unlock(&C->tab_mu);
}

/* The key an exported shareable handle is remembered by: a file descriptor's number, a fabric handle's
 * bytes; 0 for a type the shim does not follow. */
static uint64_t shareable_key(int type, const void *shareable, int imported)
{
    if (shareable == NULL && !(imported && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return 0;
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        int fd = imported ? (int)(intptr_t)shareable : *(const int *)shareable;
        return fd < 0 ? 0 : ((uint64_t)fd << 8) | 1;
    }
    if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
        const unsigned char *b = shareable;
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
        for (size_t k = 0; k < sizeof(CUmemFabricHandle); k++)
            h = (h ^ b[k]) * 0x100000001b3ull;
        return (h << 8) | 2;
    }
    return 0;
}

void gs_cap_exported(int type, const void *shareable, uint64_t handle)
{
    uint64_t key = shareable_key(type, shareable, 0);
    if (key == 0)
        return;
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(key, GS_CAP_EXPORT);
    if (i != SIZE_MAX)
        C->tab[i].bytes = handle; /* a number the kernel gave again: the newest export */
    else if (room_for_locked(1))
        put_locked((struct cap_entry){.key = key, .bytes = handle, .kind = GS_CAP_EXPORT, .refs = 1});
    pthread_mutex_unlock(&C->tab_mu);
}

/* An import of this process's own export is the memory its handle already charges: the new handle shares
 * that charge (one more reference to it, held until the new handle's last reference goes), so that
 * neither is counted twice nor lost when the original is released. An import from elsewhere is charged
 * where it is mapped (gs_cap_map), since only a mapping says how large it is. */
void gs_cap_imported(int type, const void *os_handle, uint64_t handle)
{
    uint64_t key = shareable_key(type, os_handle, 1);
    if (key == 0 || handle == 0)
        return;
    pthread_mutex_lock(&C->tab_mu);
    size_t e = find_locked(key, GS_CAP_EXPORT);
    uint64_t orig = e != SIZE_MAX ? C->tab[e].bytes : 0;
    size_t o = orig != 0 ? find_ref_locked(orig) : SIZE_MAX;
    if (o != SIZE_MAX && orig == handle) {
        C->tab[o].refs++; /* the driver gave the same handle again: one more reference */
    } else if (o != SIZE_MAX && find_locked(handle, GS_CAP_HANDLE) == SIZE_MAX && room_for_locked(1)) {
        o = find_ref_locked(orig); /* grow moved it */
        C->tab[o].refs++;
        C->tab[o].held++;
        put_locked((struct cap_entry){.key = handle, .bytes = 0, .kind = GS_CAP_HANDLE, .refs = 1, .parent = orig});
    }
    pthread_mutex_unlock(&C->tab_mu);
}

/* The driver's allocation granularity of the calling thread's device (2 MiB where it cannot tell). */
static uint64_t granularity(void)
{
    uint64_t g = atomic_load_explicit(&C->gran, memory_order_relaxed);
    if (GS_LIKELY(g != 0))
        return g;
    gs_fn_cuCtxGetDevice getdev = (gs_fn_cuCtxGetDevice)gs_real(GS_ID_cuCtxGetDevice);
    gs_fn_cuMemGetAllocationGranularity ask =
        (gs_fn_cuMemGetAllocationGranularity)gs_real(GS_ID_cuMemGetAllocationGranularity);
    CUdevice dev = 0;
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t got = 0;
    if (getdev != NULL && getdev(&dev) == CUDA_SUCCESS)
        p.location.id = dev;
    if (ask == NULL || ask(&got, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || got == 0 ||
        (got & (got - 1)) != 0)
        got = 2u << 20;
    atomic_store_explicit(&C->gran, (uint64_t)got, memory_order_relaxed);
    return got;
}

/* What the driver takes for an allocation of n bytes: measured on an H100 (driver 580), allocations of up
 * to half a granule are packed into shared granules (256 x 64 KiB took 16 MiB) and larger ones take whole
 * granules (256 x (1 MiB + 1) took 512 MiB, 256 x (2 MiB + 1) took 1 GiB). */
uint64_t gs_cap_size(uint64_t n)
{
    uint64_t g = granularity();
    if (n <= g / 2 || n > UINT64_MAX - g)
        return n;
    return (n + g - 1) & ~(g - 1);
}

/* The device malloc heap (cuCtxSetLimit CU_LIMIT_MALLOC_HEAP_SIZE): charged at the size set, the change
 * taken before the driver is asked and settled with its answer; one change at a time. */
CUresult gs_cap_heap(uint64_t value, CUresult (*set)(uint64_t value))
{
    pthread_mutex_lock(&C->heap_mu);
    uint64_t old = C->heap;
    CUresult r = value > old ? gs_cap_charge(value - old) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        r = set(value);
        if (r != CUDA_SUCCESS && value > old)
            gs_cap_uncharge(value - old);
        else if (r == CUDA_SUCCESS) {
            if (value < old)
                gs_cap_uncharge(old - value);
            C->heap = value;
        }
    }
    pthread_mutex_unlock(&C->heap_mu);
    return r;
}

/* Drops one reference a mapping or a sharing handle held on handle's entry; returns the bytes to give
 * back when it was the last. tab_mu held. */
static uint64_t unref_locked(uint64_t handle)
{
    size_t i = find_ref_locked(handle);
    if (i == SIZE_MAX)
        return 0;
    if (C->tab[i].held > 0)
        C->tab[i].held--;
    if (--C->tab[i].refs > 0)
        return 0;
    uint64_t b = C->tab[i].bytes, parent = C->tab[i].parent;
    remove_at_locked(i);
    return parent != 0 ? b + unref_locked(parent) : b;
}

void gs_cap_unmap(CUdeviceptr va, size_t size)
{
    uint64_t back = 0;
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(va, GS_CAP_MAP);
    if (i != SIZE_MAX) {
        /* the usual case: one mapping unmapped where it starts */
        uint64_t h = C->tab[i].bytes;
        remove_at_locked(i);
        back += unref_locked(h);
    }
    if (size > 0 && C->tab_cap > 0) {
        /* a range over several mappings (vectorAddMMAP unmaps its whole range at once): every mapping that
         * starts inside it; rare, so a scan. A removal moves entries, so the scan starts again after one. */
        for (size_t j = 0; j < C->tab_cap; j++) {
            if (C->tab[j].key != 0 && C->tab[j].kind == GS_CAP_MAP && C->tab[j].key > va && C->tab[j].key - va < size) {
                uint64_t h = C->tab[j].bytes;
                remove_at_locked(j);
                back += unref_locked(h);
                j = (size_t)-1;
            }
        }
    }
    pthread_mutex_unlock(&C->tab_mu);
    if (back > 0)
        gs_cap_uncharge(back);
}

static int free_begin(uint32_t kind, uint64_t key, struct gs_cap_free *f)
{
    f->kind = kind;
    f->key = key;
    f->bytes = 0;
    f->parent = 0;
    f->refs = 0;
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(key, kind);
    if (i != SIZE_MAX) {
        f->bytes = C->tab[i].bytes;
        f->parent = C->tab[i].parent;
        f->refs = C->tab[i].refs;
        if (f->refs > 1)
            C->tab[i].refs--; /* a handle still retained: its pages stay, and so does the charge */
        else
            remove_at_locked(i); /* before the driver frees it, so that a new allocation may reuse the address */
    }
    pthread_mutex_unlock(&C->tab_mu);
    return i != SIZE_MAX;
}

int gs_cap_owner(uint32_t kind, uint64_t key)
{
    int saved = gs_dev_cur, owner = GS_DEV_NONE;
    for (gs_dev_cur = 0; gs_dev_cur < gs_ndevs && owner == GS_DEV_NONE; gs_dev_cur++) {
        pthread_mutex_lock(&C->tab_mu);
        if (find_locked(key, kind) != SIZE_MAX)
            owner = gs_dev_cur;
        pthread_mutex_unlock(&C->tab_mu);
    }
    gs_dev_cur = saved;
    return owner;
}

/* A free gives back to the GPU whose limit counted it, whichever context is current. */
int gs_cap_free_begin(uint32_t kind, uint64_t key, struct gs_cap_free *f)
{
    int saved = gs_dev_cur;
    if (gs_multi) {
        int owner = gs_cap_owner(kind, key);
        if (owner != GS_DEV_NONE)
            gs_dev_cur = owner;
    }
    f->dev = gs_dev_cur;
    int r = free_begin(kind, key, f);
    gs_dev_cur = saved;
    return r;
}

static void free_end(const struct gs_cap_free *f, CUresult r)
{
    if (f->refs == 0)
        return; /* not ours to count */
    if (r != CUDA_SUCCESS) {
        /* The driver refused the free: the memory is still allocated, and still charged. */
        pthread_mutex_lock(&C->tab_mu);
        size_t i = find_locked(f->key, f->kind);
        if (i != SIZE_MAX)
            C->tab[i].refs++;
        if (i == SIZE_MAX && f->parent != 0 && room_for_locked(1)) {
            /* a shared charge: the entry again, still holding its reference to the original */
            put_locked((struct cap_entry){.key = f->key, .kind = f->kind, .refs = 1, .parent = f->parent});
            i = 0;
        }
        pthread_mutex_unlock(&C->tab_mu);
        if (i == SIZE_MAX && f->parent == 0)
            gs_cap_track(f->kind, f->key, f->bytes); /* the charge is still held: track gives it back on failure */
        return;
    }
    if (f->refs > 1) {
        if (f->kind == GS_CAP_HANDLE) {
            pthread_mutex_lock(&C->tab_mu);
            size_t i = find_locked(f->key, GS_CAP_HANDLE);
            if (i != SIZE_MAX && C->tab[i].refs == C->tab[i].held)
                ghost_locked(i); /* released by the application, still held by its mappings or sharers */
            pthread_mutex_unlock(&C->tab_mu);
        }
        return;
    }
    uint64_t back = f->bytes;
    if (f->parent != 0) {
        pthread_mutex_lock(&C->tab_mu);
        back += unref_locked(f->parent);
        pthread_mutex_unlock(&C->tab_mu);
    }
    if (back > 0)
        gs_cap_uncharge(back);
}

void gs_cap_free_end(const struct gs_cap_free *f, CUresult r)
{
    int saved = gs_dev_cur;
    gs_dev_cur = f->dev;
    free_end(f, r);
    gs_dev_cur = saved;
}


/*
 * The claim's ledger (protocol 6; gpushare_proto.h, docs/shim.md "Memory limit"). Where the scheduler puts
 * this process in a claim's ledger, the process allocates within its grant without asking: room is the
 * grant less what is charged, taken and given back by the same atomic steps as the limit. Beyond it, the
 * allocating thread asks the scheduler (CHARGE) and waits for the answer at most
 * GPUSHARE_MEMREPLY_TIMEOUT_MS; a refusal or no answer in time fails the allocation with out of memory.
 * More than two chunks of room unused go back (RETURN), so one process's slack does not starve the
 * others of its claim. Without a ledger (no scheduler, an older one, a process in no claim) the limit
 * alone holds, as before.
 *
 * grant = charged + room holds across every change: a charge takes room, a free gives it back. The read
 * lock keeps each of those steps whole against a connection's start, which sets room to 0 and announces
 * what is charged as the grant (RETURN flags HOLD), under the write lock.
 */

static void rep_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&C->rep_cv, &a);
    pthread_condattr_destroy(&a);
}

static int take_room(uint64_t n)
{
    int64_t r = atomic_load_explicit(&C->room, memory_order_relaxed);
    do {
        if (r < 0 || (uint64_t)r < n)
            return 0;
    } while (!atomic_compare_exchange_weak_explicit(&C->room, &r, r - (int64_t)n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return 1;
}

static void ledger_refused(uint64_t n, const char *why)
{
    static atomic_int warned;
    uint64_t t = atomic_load(&C->led_total), o = atomic_load(&C->led_others);
    gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
           "out of memory: %llu bytes more %s (the claim's processes may allocate %llu bytes together: the claim "
           "less each process's context charge; the others hold %llu, this process %llu)",
           (unsigned long long)n, why, (unsigned long long)t, (unsigned long long)o,
           (unsigned long long)gs_cap_used());
}

/* Waits, at most until the request's deadline, for the next connection after the last one ended; 0 once
 * it is there (or the ledger is off), -1 when the wait timed out. Called with req_mu held. */
static int await_next_connection(uint64_t n, uint64_t began)
{
    gs_log(GS_LOG_INFO,
           "memory: %llu bytes more wait for the GPU scheduler, which is away, to grant them (at most "
           "GPUSHARE_MEMREPLY_TIMEOUT_MS=%u ms)",
           (unsigned long long)n, gs_cfg.memreply_timeout_ms);
    pthread_mutex_lock(&C->rep_mu);
    int timed_out = 0;
    while (atomic_load(&C->led_on) && atomic_load(&C->led_away)) {
        uint64_t end = began + (uint64_t)gs_cfg.memreply_timeout_ms * 1000000ull;
        if (gs_now_ns() >= end) {
            timed_out = 1;
            break;
        }
        struct timespec ts = {.tv_sec = (time_t)(end / 1000000000ull), .tv_nsec = (long)(end % 1000000000ull)};
        pthread_cond_timedwait(&C->rep_cv, &C->rep_mu, &ts);
    }
    pthread_mutex_unlock(&C->rep_mu);
    return timed_out ? -1 : 0;
}

/* n is charged to the limit and room had not enough: ask the scheduler. While there is none (the
 * connection ended: an agent restart), the allocation waits for the next connection, within
 * GPUSHARE_MEMREPLY_TIMEOUT_MS, and asks that one: the next scheduler sees of this process only what it
 * holds (NVML's figure, then its Hold), so room granted by the last one would let it pass the claim
 * beside a process the next one admitted meanwhile. Once a wait timed out, later allocations past what
 * is charged fail at once until the next connection, so a scheduler gone for good costs one wait. */
static CUresult ledger_more(uint64_t n)
{
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->req_mu);
    CUresult res = CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t began = gs_now_ns();
    for (int round = 0;;) {
        pthread_rwlock_rdlock(&C->led_rw);
        int on = atomic_load(&C->led_on), got = on && take_room(n);
        if (!on || got)
            atomic_fetch_sub(&C->asking, n); /* granted (or the limit alone): held from now on */
        pthread_rwlock_unlock(&C->led_rw);
        if (!on || got) {
            res = CUDA_SUCCESS; /* no ledger any more (the limit alone), or a grant another thread asked for */
            break;
        }
        if (atomic_load(&C->led_away)) {
            if (atomic_load(&C->away_gave_up) || await_next_connection(n, began) != 0) {
                atomic_store(&C->away_gave_up, 1);
                ledger_refused(n, "waited in vain for the GPU scheduler, which is away, to grant "
                                  "(GPUSHARE_MEMREPLY_TIMEOUT_MS)");
                break;
            }
            continue; /* connected again (or the ledger is off): ask that connection */
        }
        if (round++ == 3) {
            ledger_refused(n, "found the grant taken by this process's other threads");
            break;
        }
        struct gs_charge m;
        memset(&m, 0, sizeof(m));
        pthread_mutex_lock(&C->rep_mu);
        uint32_t seq = ++C->req_seq;
        pthread_mutex_unlock(&C->rep_mu);
        m.seq = seq;
        m.bytes = n;
        if (gs_gate_send(&m, GS_MSG_CHARGE, GS_CHARGE_SIZE) != 0)
            continue; /* not connected: the next round finds the ledger off */
        /* The timeout is read again at every wake: a CHARGE sent before the connection's POLICY was read
         * waits as that POLICY says (gs_cap_policy_changed wakes it). */
        uint64_t start = gs_now_ns();
        pthread_mutex_lock(&C->rep_mu);
        int timed_out = 0;
        while (C->rep_seq != seq && atomic_load(&C->led_on) && !atomic_load(&C->led_away)) {
            uint64_t end = start + (uint64_t)gs_cfg.memreply_timeout_ms * 1000000ull;
            if (gs_now_ns() >= end) {
                timed_out = 1;
                break;
            }
            struct timespec ts = {.tv_sec = (time_t)(end / 1000000000ull), .tv_nsec = (long)(end % 1000000000ull)};
            pthread_cond_timedwait(&C->rep_cv, &C->rep_mu, &ts);
        }
        uint32_t st = C->rep_seq == seq ? C->rep_status : GS_CHARGE_REFUSED;
        int lost = C->rep_seq != seq && atomic_load(&C->led_on) && atomic_load(&C->led_away);
        pthread_mutex_unlock(&C->rep_mu);
        if (lost)
            continue; /* the connection ended before its answer: ask the next one */
        if (timed_out) {
            gs_log(GS_LOG_WARN,
                   "out of memory: the GPU scheduler did not answer a request for %llu bytes of the claim's "
                   "ledger within %u ms (GPUSHARE_MEMREPLY_TIMEOUT_MS)",
                   (unsigned long long)n, gs_cfg.memreply_timeout_ms);
            break;
        }
        if (st != GS_CHARGE_OK && atomic_load(&C->led_on)) {
            ledger_refused(n, "would pass the claim's ledger");
            break;
        }
    }
    pthread_mutex_unlock(&C->req_mu);
    return res;
}

/* Room beyond two chunks goes back to the ledger; skipped while another request is out. */
static void give_back(void)
{
    if (pthread_mutex_trylock(&C->req_mu) != 0)
        return;
    uint64_t chunk = atomic_load(&C->led_chunk);
    int64_t r = atomic_load(&C->room);
    if (atomic_load(&C->led_on) && r > 0 && (uint64_t)r > 2 * chunk &&
        atomic_compare_exchange_strong(&C->room, &r, (int64_t)chunk)) {
        struct gs_return m;
        memset(&m, 0, sizeof(m));
        m.bytes = (uint64_t)r - chunk;
        gs_gate_send(&m, GS_MSG_RETURN, GS_RETURN_SIZE); /* unsent: the connection is gone, and its grant with it */
    }
    pthread_mutex_unlock(&C->req_mu);
}

void gs_cap_ledger_offer(const struct gs_ledger *l)
{
    C->offered = *l;
    C->offered_set = 1;
}

/* A LEDGER that says REFUSED reaches a process before its first context (it connects when it creates
 * one): the context creation fails, and every later one on this connection. A process with a context
 * (one created before a scheduler restart) announces it with RETURN HOLD, and so is admitted. */
void gs_cap_ledger_start(int fd)
{
    int set = C->offered_set;
    C->offered_set = 0;
    atomic_store(&C->led_refused, 0);
    if (!set || !(C->offered.flags & (GS_LEDGER_ON | GS_LEDGER_REFUSED))) {
        gs_cap_ledger_stop(); /* this scheduler keeps no ledger for it: the limit alone */
        return;
    }
    int announce = (C->offered.flags & GS_LEDGER_REFUSED) != 0;
    if (announce && !atomic_load(&C->ctx_made)) {
        atomic_store(&C->led_refused, 1);
        gs_log(GS_LOG_WARN,
               "out of memory: this process may not create a CUDA context: its claim of %llu bytes on this GPU has "
               "no room for one more (%u processes hold %llu bytes and %llu bytes each for their contexts)",
               (unsigned long long)C->offered.claim, C->offered.processes, (unsigned long long)C->offered.granted,
               (unsigned long long)C->offered.reserve);
        return;
    }
    if (!gs_cap_on()) {
        if (announce) {
            struct gs_return m;
            memset(&m, 0, sizeof(m));
            m.flags = GS_RETURN_HOLD;
            gs_conn_send_raw(fd, &m, GS_MSG_RETURN, GS_RETURN_SIZE);
        }
        return;
    }
    pthread_rwlock_wrlock(&C->led_rw);
    atomic_store(&C->room, 0);
    uint64_t held = atomic_load(&C->charged) - atomic_load(&C->asking);
    atomic_store(&C->led_total, C->offered.total);
    atomic_store(&C->led_others, C->offered.granted - C->offered.grant);
    atomic_store(&C->led_chunk, C->offered.chunk);
    atomic_store(&C->led_on, 1);
    atomic_store(&C->led_away, 0);
    atomic_store(&C->away_gave_up, 0);
    if (held > 0 || announce) {
        struct gs_return m;
        memset(&m, 0, sizeof(m));
        m.flags = GS_RETURN_HOLD;
        m.bytes = held;
        gs_conn_send_raw(fd, &m, GS_MSG_RETURN, GS_RETURN_SIZE);
    }
    pthread_rwlock_unlock(&C->led_rw);
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->rep_mu);
    pthread_cond_broadcast(&C->rep_cv); /* an allocation waiting for this connection asks it now */
    pthread_mutex_unlock(&C->rep_mu);
    gs_log(GS_LOG_INFO,
           "memory: this process is one of %u of a claim of %llu bytes on this GPU; their allocations may reach "
           "%llu bytes together (%llu bytes charged for this process's CUDA context); %llu bytes held",
           C->offered.processes, (unsigned long long)C->offered.claim, (unsigned long long)C->offered.total,
           (unsigned long long)C->offered.reserve, (unsigned long long)held);
}

void gs_cap_ledger_stop(void)
{
    if (!atomic_load(&C->led_on))
        return;
    pthread_rwlock_wrlock(&C->led_rw);
    atomic_store(&C->led_on, 0);
    atomic_store(&C->led_away, 0);
    pthread_rwlock_unlock(&C->led_rw);
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->rep_mu);
    pthread_cond_broadcast(&C->rep_cv); /* a waiting request goes on with the limit alone */
    pthread_mutex_unlock(&C->rep_mu);
}

/* The connection ended. A process that went on to the whole limit while it was away could hold the claim's
 * allocations and its context together, past the claim; one that went on within its grant could too: the
 * next scheduler counts it only by what it holds, and may admit another process of the claim before this
 * one is back. So the unused room goes with the connection: allocations past what is charged wait for the
 * next connection's LEDGER and ask it (ledger_more), and frees meanwhile add no room. A request waiting for
 * its answer asks the next connection. */
void gs_cap_ledger_away(void)
{
    if (!atomic_load(&C->led_on))
        return;
    pthread_rwlock_wrlock(&C->led_rw);
    atomic_store(&C->led_away, 1);
    atomic_store(&C->room, 0);
    pthread_rwlock_unlock(&C->led_rw);
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->rep_mu);
    pthread_cond_broadcast(&C->rep_cv);
    pthread_mutex_unlock(&C->rep_mu);
}

void gs_cap_policy_changed(void)
{
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->rep_mu);
    pthread_cond_broadcast(&C->rep_cv); /* a waiting CHARGE's timeout may be another one now */
    pthread_mutex_unlock(&C->rep_mu);
}

uint32_t gs_cap_msg_size(uint16_t type, uint16_t version)
{
    if (version < 6)
        return 0;
    return type == GS_MSG_LEDGER ? GS_LEDGER_SIZE : type == GS_MSG_CHARGED ? GS_CHARGED_SIZE : 0;
}

void gs_cap_on_message(int fd, const unsigned char *msg, uint16_t type)
{
    if (type == GS_MSG_LEDGER) {
        struct gs_ledger l;
        memcpy(&l, msg, sizeof(l));
        if ((l.flags & GS_LEDGER_ON) && !atomic_load(&C->led_on) && fd >= 0) {
            /* placed in a ledger after connecting (its pod was found late): announce what it holds */
            l.flags |= GS_LEDGER_REFUSED;
            l.flags &= ~GS_LEDGER_ON;
            atomic_store(&C->ctx_made, 1); /* it ran outside the ledger; count it as one with a context */
            gs_cap_ledger_offer(&l);
            gs_cap_ledger_start(fd);
            return;
        }
        atomic_store(&C->led_total, l.total);
        atomic_store(&C->led_others, l.granted - l.grant);
        return;
    }
    if (type != GS_MSG_CHARGED)
        return;
    struct gs_charged c;
    memcpy(&c, msg, sizeof(c));
    if (c.status == GS_CHARGE_OK && atomic_load(&C->led_on))
        atomic_fetch_add(&C->room, (int64_t)c.added); /* even when its asker gave up waiting: it is our grant */
    atomic_store(&C->led_total, c.total);
    atomic_store(&C->led_others, c.granted - c.grant);
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->rep_mu);
    C->rep_seq = c.seq;
    C->rep_status = c.status;
    pthread_cond_broadcast(&C->rep_cv);
    pthread_mutex_unlock(&C->rep_mu);
}

/* ---- the limit and the ledger together ---- */

static CUresult charge_limit(uint64_t n)
{
    uint64_t lim = gs_devs[gs_dev_cur].memory_limit;
    uint64_t cur = atomic_load_explicit(&C->charged, memory_order_relaxed);
    do {
        if (n > lim || cur > lim - n) {
            static atomic_int warned;
            gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
                   "out of memory: %llu bytes more would pass this process's memory limit of %llu bytes "
                   "(GPUSHARE_MEMORY_LIMIT_BYTES; %llu allocated)",
                   (unsigned long long)n, (unsigned long long)lim, (unsigned long long)cur);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } while (!atomic_compare_exchange_weak_explicit(&C->charged, &cur, cur + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return CUDA_SUCCESS;
}

static void uncharge_limit(uint64_t n)
{
    atomic_fetch_sub_explicit(&C->charged, n, memory_order_relaxed);
}

/* A context creation connects first (gs_cap_ctx_admit); so does the first allocation or memory query of
 * a process whose context the hooks did not see, so that a process in a claim's ledger is in it before
 * it allocates or sizes itself. */
static void connect_once(void)
{
    if (GS_UNLIKELY(!atomic_load_explicit(&C->connect_asked, memory_order_relaxed)) && !atomic_exchange(&C->connect_asked, 1))
        gs_gate_connect();
}

CUresult gs_cap_charge(uint64_t n)
{
    connect_once();
    pthread_rwlock_rdlock(&C->led_rw);
    CUresult r = charge_limit(n);
    int more = r == CUDA_SUCCESS && atomic_load(&C->led_on) && !take_room(n);
    if (more)
        atomic_fetch_add(&C->asking, n);
    pthread_rwlock_unlock(&C->led_rw);
    if (!more)
        return r;
    r = ledger_more(n);
    if (r != CUDA_SUCCESS) {
        pthread_rwlock_rdlock(&C->led_rw);
        uncharge_limit(n); /* room was never taken */
        atomic_fetch_sub(&C->asking, n);
        pthread_rwlock_unlock(&C->led_rw);
    }
    return r;
}

void gs_cap_uncharge(uint64_t n)
{
    pthread_rwlock_rdlock(&C->led_rw);
    uncharge_limit(n);
    int on = atomic_load(&C->led_on) && !atomic_load(&C->led_away); /* away: the room went with the connection */
    int64_t r = on ? atomic_fetch_add(&C->room, (int64_t)n) + (int64_t)n : 0;
    pthread_rwlock_unlock(&C->led_rw);
    if (on && r > 0 && (uint64_t)r > 2 * atomic_load(&C->led_chunk))
        give_back();
}

/* The limit, and under a ledger what the claim leaves this process: its total less the others' grants
 * and what this process has charged, so that allocating all of free keeps the claim's processes within
 * the claim as NVML counts it. */
void gs_cap_report(uint64_t drv_total, uint64_t drv_free, uint64_t *total, uint64_t *free_)
{
    connect_once();
    uint64_t lim = gs_devs[gs_dev_cur].memory_limit, used = gs_cap_used();
    uint64_t room_lim = used < lim ? lim - used : 0;
    if (atomic_load(&C->led_on)) {
        uint64_t t = atomic_load(&C->led_total), taken = atomic_load(&C->led_others) + used;
        uint64_t left = t > taken ? t - taken : 0;
        lim = t < lim ? t : lim;
        room_lim = left < room_lim ? left : room_lim;
    }
    *total = lim < drv_total ? lim : drv_total;
    *free_ = room_lim < drv_free ? room_lim : drv_free;
}

void gs_cap_atfork_child(void)
{
    /* CUDA does not survive fork: the child starts with nothing allocated. The mutex may have been
     * held by another thread of the parent. */
    pthread_mutex_init(&C->tab_mu, NULL);
    pthread_mutex_init(&C->heap_mu, NULL);
    C->heap = 0;
    free(C->tab);
    C->tab = NULL;
    C->tab_cap = C->tab_len = 0;
    atomic_store(&C->charged, 0);
    atomic_store(&C->asking, 0);
    /* the parent's ledger is its connection's; the child is a new client */
    pthread_rwlock_init(&C->led_rw, NULL);
    pthread_mutex_init(&C->req_mu, NULL);
    pthread_mutex_init(&C->rep_mu, NULL);
    atomic_store(&C->led_on, 0);
    atomic_store(&C->led_away, 0);
    atomic_store(&C->away_gave_up, 0);
    atomic_store(&C->room, 0);
    atomic_store(&C->connect_asked, 0);
    atomic_store(&C->led_refused, 0);
    atomic_store(&C->ctx_made, 0);
    C->offered_set = 0;
}

CUresult gs_cap_ctx_admit(void)
{
    /* Not connect_once: a second thread must wait for the first one's answer, which the gate's mutex
     * gives; context creations are rare. */
    gs_gate_connect();
    atomic_store(&C->connect_asked, 1);
    if (GS_LIKELY(!atomic_load(&C->led_refused)))
        return CUDA_SUCCESS;
    static atomic_int warned;
    gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
           "out of memory: a CUDA context creation refused (the claim's ledger has no room for this process's "
           "context)");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void gs_cap_ctx_made(void)
{
    atomic_store(&C->ctx_made, 1);
}
