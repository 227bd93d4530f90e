/*
 * Symbol resolution: the real dlsym (through dlvsym, never the public dlsym),
 * the configuration and the fork handler in one pthread_once initializer,
 * and the binding of the real CUDA entry points.
 *
 * Why binding is not inside the pthread_once: every dlsym call of the process
 * goes through us, including Python's lookups of extension modules long before
 * anybody loads libcuda, and loading libcuda ourselves would drag the driver
 * into processes that never touch a GPU. So the table is bound, once, at the
 * first moment libcuda is known to be loaded (a cu* hook runs, or dlsym hands
 * out a cu* symbol); until then the initializer leaves it empty.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef void *(*dlsym_fn)(void *, const char *);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static dlsym_fn real_dlsym;

_Atomic(void *) gs_real_fn[GS_HOOK_COUNT];
static atomic_int cuda_bound;
static pthread_mutex_t bind_mu = PTHREAD_MUTEX_INITIALIZER;

const char *const gs_hook_names[GS_HOOK_COUNT] = {
#define GS_HOOK(cls, name, params, args, extra) [GS_ID_##name] = #name,
#include "hooks.def"
#undef GS_HOOK
};

/* Our wrapper for each hook; NULL for USE entries, which are never handed out. */
#define GS_DECL_WORK(name, params) GS_EXPORT CUresult name params;
#define GS_DECL_SWORK GS_DECL_WORK
#define GS_DECL_COPY GS_DECL_WORK
#define GS_DECL_SCOPY GS_DECL_WORK
#define GS_DECL_LAUNCH GS_DECL_WORK
#define GS_DECL_DEVGONE GS_DECL_WORK
#define GS_DECL_CAPBEGIN GS_DECL_WORK
#define GS_DECL_CAPEND GS_DECL_WORK
#define GS_DECL_CTXNEW GS_DECL_WORK
#define GS_DECL_CTXGONE GS_DECL_WORK
#define GS_DECL_PROC GS_DECL_WORK
#define GS_DECL_MM GS_DECL_WORK
#define GS_DECL_USE(name, params)
#define GS_HOOK(cls, name, params, args, extra) GS_DECL_##cls(name, params)
#include "hooks.def"
#undef GS_HOOK

#define GS_PTR_WORK(name) (void *)&name
#define GS_PTR_SWORK GS_PTR_WORK
#define GS_PTR_COPY GS_PTR_WORK
#define GS_PTR_SCOPY GS_PTR_WORK
#define GS_PTR_LAUNCH GS_PTR_WORK
#define GS_PTR_DEVGONE GS_PTR_WORK
#define GS_PTR_CAPBEGIN GS_PTR_WORK
#define GS_PTR_CAPEND GS_PTR_WORK
#define GS_PTR_CTXNEW GS_PTR_WORK
#define GS_PTR_CTXGONE GS_PTR_WORK
#define GS_PTR_PROC GS_PTR_WORK
#define GS_PTR_MM GS_PTR_WORK
#define GS_PTR_USE(name) NULL
static void *const hook_fn[GS_HOOK_COUNT] = {
#define GS_HOOK(cls, name, params, args, extra) [GS_ID_##name] = GS_PTR_##cls(name),
#include "hooks.def"
#undef GS_HOOK
};


static void do_init(void)
{
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (real_dlsym == NULL)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    gs_config_load();
    gs_pace_init();
    if (real_dlsym == NULL)
        gs_warn_failopen("cannot find the C library's dlsym");
    pthread_atfork(gs_gate_atfork_prepare, gs_gate_atfork_parent, gs_gate_atfork_child);
    atexit(gs_print_call_counts);
}

void *gs_real_dlsym(void *handle, const char *name)
{
    return real_dlsym != NULL ? real_dlsym(handle, name) : NULL;
}

void gs_init(void)
{
    pthread_once(&init_once, do_init);
}

int gs_id_for_name(const char *name)
{
    if (name == NULL || name[0] != 'c' || name[1] != 'u')
        return -1;
    for (int i = 0; i < GS_HOOK_COUNT; i++)
        if (hook_fn[i] != NULL && strcmp(gs_hook_names[i], name) == 0)
            return i;
    return -1;
}

void gs_bind_cuda(void)
{
    if (atomic_load_explicit(&cuda_bound, memory_order_acquire))
        return;
    gs_init();
    if (real_dlsym == NULL)
        return;
    pthread_mutex_lock(&bind_mu);
    if (!atomic_load(&cuda_bound)) {
        /* NOLOAD: find the driver the application loaded, RTLD_LOCAL or not. The
         * reference is kept on purpose: the driver must outlive our pointers. */
        void *h = dlopen(gs_cfg.cuda_library, RTLD_LAZY | RTLD_NOLOAD);
        if (h != NULL) {
            for (int i = 0; i < GS_HOOK_COUNT; i++) {
                void *p = real_dlsym(h, gs_hook_names[i]);
                if (p != NULL && p != hook_fn[i])
                    atomic_store_explicit(&gs_real_fn[i], p, memory_order_release);
            }
            atomic_store_explicit(&cuda_bound, 1, memory_order_release);
            gs_log(GS_LOG_DEBUG, "bound %s", gs_cfg.cuda_library);
        }
    }
    pthread_mutex_unlock(&bind_mu);
}

void *gs_bind_slow(int id)
{
    gs_bind_cuda();
    return atomic_load_explicit(&gs_real_fn[id], memory_order_acquire);
}

/*
 * cuGetProcAddress hands out the variant that matches the caller's
 * cudaVersion and flags (cuMemAlloc -> cuMemAlloc_v2, _ptsz under per-thread
 * streams ...). We never guess which one: the driver picks, and we recognise
 * its answer by address among the variants we bound, then by exported name.
 */
void *gs_substitute(const char *symbol, void *fn)
{
    for (int i = 0; i < GS_HOOK_COUNT; i++)
        if (hook_fn[i] != NULL && atomic_load_explicit(&gs_real_fn[i], memory_order_relaxed) == fn)
            return hook_fn[i];
    Dl_info info;
    if (dladdr(fn, &info) && info.dli_saddr == fn && info.dli_sname != NULL) {
        int id = gs_id_for_name(info.dli_sname);
        if (id >= 0 && hook_fn[id] == fn)
            return fn;
        if (id >= 0) {
            void *expect = NULL;
            atomic_compare_exchange_strong(&gs_real_fn[id], &expect, fn);
            return hook_fn[id];
        }
    }
    if (gs_id_for_name(symbol) >= 0) {
        static atomic_int warned;
        gs_log(atomic_exchange(&warned, 1) ? GS_LOG_DEBUG : GS_LOG_WARN,
               "cuGetProcAddress(%s) returned an address the shim does not know; calls through it bypass the GPU lock",
               symbol);
    }
    return fn;
}

/*
 * RTLD_NEXT means "after the caller", but the real dlsym would see us as the
 * caller. Walk the link map from the caller's object instead and return the
 * first definition in a later object, as the loader would have.
 */
static void *dlsym_next(const char *name, const void *caller)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || lm == NULL)
        return real_dlsym(RTLD_NEXT, name);
    for (lm = lm->l_next; lm != NULL; lm = lm->l_next) {
        if (lm->l_name == NULL || lm->l_name[0] == '\0')
            continue;
        void *h = dlopen(lm->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        void *p = real_dlsym(h, name);
        dlclose(h);
        Dl_info pi;
        struct link_map *plm = NULL;
        if (p != NULL && dladdr1(p, &pi, (void **)&plm, RTLD_DL_LINKMAP) && plm == lm)
            return p;
    }
    return NULL;
}

GS_EXPORT void *dlsym(void *handle, const char *name)
{
    gs_init();
    if (GS_UNLIKELY(real_dlsym == NULL))
        return NULL;
    void *r = handle == RTLD_NEXT ? dlsym_next(name, __builtin_return_address(0)) : real_dlsym(handle, name);
    if (r == NULL)
        return NULL;
    int id = gs_id_for_name(name);
    if (id < 0)
        return name[0] == 'n' ? gs_nvml_dlsym(name, r) : r;
    /* The driver answered for a name we hook: libcuda is loaded, bind it. */
    gs_bind_cuda();
    if (r == hook_fn[id] && atomic_load(&gs_real_fn[id]) == NULL)
        return NULL; /* only our own export answered: without a driver the name does not exist */
    if (r != hook_fn[id]) {
        void *expect = NULL;
        atomic_compare_exchange_strong(&gs_real_fn[id], &expect, r);
    }
    return hook_fn[id];
}
