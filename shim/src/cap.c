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
    uint32_t kind; /* GS_CAP_PTR or GS_CAP_HANDLE: a handle's value may equal some pointer's */
    uint32_t refs; /* handles: cuMemCreate and cuMemRetainAllocationHandle, less cuMemRelease */
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
    atomic_int led_away; /* led_on, and the connection ended: the grant bounds it, nobody to ask */
    _Atomic int64_t room;
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
};
static struct cap_dev caps[GS_DEV_SLOTS] = {
    [0 ... GS_DEV_SLOTS - 1] = {.tab_mu = PTHREAD_MUTEX_INITIALIZER,
                                .led_rw = PTHREAD_RWLOCK_INITIALIZER,
                                .req_mu = PTHREAD_MUTEX_INITIALIZER,
                                .rep_mu = PTHREAD_MUTEX_INITIALIZER,
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

/* A mapping is one more reference to its handle's entry (the handle's bytes stay charged while it lives),
 * remembered by its address (kind GS_CAP_MAP, bytes: the handle) for cuMemUnmap, which names addresses. */
void gs_cap_map(CUdeviceptr va, uint64_t handle)
{
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(handle, GS_CAP_HANDLE);
    if (i != SIZE_MAX && va != 0 && find_locked(va, GS_CAP_MAP) == SIZE_MAX &&
        ((C->tab_len + 1) * 2 <= C->tab_cap || grow_locked() == 0)) {
        i = find_locked(handle, GS_CAP_HANDLE); /* grow moved it */
        C->tab[i].refs++;
        put_locked((struct cap_entry){.key = va, .bytes = handle, .kind = GS_CAP_MAP, .refs = 1});
    }
    pthread_mutex_unlock(&C->tab_mu);
}

/* Drops one reference of handle's entry; returns the bytes to give back when it was the last. tab_mu held. */
static uint64_t unref_locked(uint64_t handle)
{
    size_t i = find_locked(handle, GS_CAP_HANDLE);
    if (i == SIZE_MAX)
        return 0;
    if (--C->tab[i].refs > 0)
        return 0;
    uint64_t b = C->tab[i].bytes;
    remove_at_locked(i);
    return b;
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
    f->refs = 0;
    pthread_mutex_lock(&C->tab_mu);
    size_t i = find_locked(key, kind);
    if (i != SIZE_MAX) {
        f->bytes = C->tab[i].bytes;
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
        pthread_mutex_unlock(&C->tab_mu);
        if (i == SIZE_MAX)
            gs_cap_track(f->kind, f->key, f->bytes); /* the charge is still held: track gives it back on failure */
        return;
    }
    if (f->refs == 1)
        gs_cap_uncharge(f->bytes);
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
           "less a context reserve per process; the others hold %llu, this process %llu)",
           (unsigned long long)n, why, (unsigned long long)t, (unsigned long long)o,
           (unsigned long long)gs_cap_used());
}

/* n is charged to the limit and room had not enough: ask the scheduler. */
static CUresult ledger_more(uint64_t n)
{
    pthread_once(&C->rep_once, rep_init);
    pthread_mutex_lock(&C->req_mu);
    CUresult res = CUDA_ERROR_OUT_OF_MEMORY;
    for (int round = 0;; round++) {
        pthread_rwlock_rdlock(&C->led_rw);
        int on = atomic_load(&C->led_on), got = on && take_room(n);
        pthread_rwlock_unlock(&C->led_rw);
        if (!on || got) {
            res = CUDA_SUCCESS; /* no ledger any more (the limit alone), or a grant another thread asked for */
            break;
        }
        if (atomic_load(&C->led_away)) {
            ledger_refused(n, "would pass what the claim's ledger granted this process (the GPU scheduler is away)");
            break;
        }
        if (round == 3) {
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
        pthread_mutex_unlock(&C->rep_mu);
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
    uint64_t held = atomic_load(&C->charged);
    atomic_store(&C->led_total, C->offered.total);
    atomic_store(&C->led_others, C->offered.granted - C->offered.grant);
    atomic_store(&C->led_chunk, C->offered.chunk);
    atomic_store(&C->led_on, 1);
    atomic_store(&C->led_away, 0);
    if (held > 0 || announce) {
        struct gs_return m;
        memset(&m, 0, sizeof(m));
        m.flags = GS_RETURN_HOLD;
        m.bytes = held;
        gs_conn_send_raw(fd, &m, GS_MSG_RETURN, GS_RETURN_SIZE);
    }
    pthread_rwlock_unlock(&C->led_rw);
    gs_log(GS_LOG_INFO,
           "memory: this process is one of %u of a claim of %llu bytes on this GPU; their allocations may reach "
           "%llu bytes together (%llu bytes per process for its CUDA context); %llu bytes held",
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

/* The grant is what the scheduler counts for this process; a process that went on to the whole limit while
 * it was away could hold the claim's allocations and its context together, past the claim. Allocations
 * within the grant go on; past it they fail with out of memory until the next connection's LEDGER (or, with
 * none there, the limit alone). A request waiting for its answer is refused. */
void gs_cap_ledger_away(void)
{
    if (!atomic_load(&C->led_on))
        return;
    atomic_store(&C->led_away, 1);
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
    pthread_rwlock_unlock(&C->led_rw);
    if (!more)
        return r;
    r = ledger_more(n);
    if (r != CUDA_SUCCESS)
        uncharge_limit(n); /* room was never taken */
    return r;
}

void gs_cap_uncharge(uint64_t n)
{
    pthread_rwlock_rdlock(&C->led_rw);
    uncharge_limit(n);
    int on = atomic_load(&C->led_on);
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
    free(C->tab);
    C->tab = NULL;
    C->tab_cap = C->tab_len = 0;
    atomic_store(&C->charged, 0);
    /* the parent's ledger is its connection's; the child is a new client */
    pthread_rwlock_init(&C->led_rw, NULL);
    pthread_mutex_init(&C->req_mu, NULL);
    pthread_mutex_init(&C->rep_mu, NULL);
    atomic_store(&C->led_on, 0);
    atomic_store(&C->led_away, 0);
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
