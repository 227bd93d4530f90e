/*
 * NVML's memory queries under the memory limit (cap.c). Frameworks and tools that size themselves
 * from NVML (nvidia-smi, pynvml, vLLM's and others' start-up checks) must see the limit as the
 * GPU's memory, as cuMemGetInfo shows it.
 *
 * NVML is reached two ways, and both are covered: through dlsym on the libnvidia-ml handle (ctypes,
 * PyTorch's and most loaders), where our dlsym hands out the wrappers below in place of NVML's own,
 * and through a direct link to libnvidia-ml.so.1, where the wrappers, exported and preloaded, come
 * first. Only nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2 are answered: every other NVML
 * call (per-process memory lists, BAR1, utilization) is the driver's, unchanged. Without a limit
 * dlsym hands out NVML's own functions, and the exports pass straight through.
 */
#include <dlfcn.h>
#include <string.h>

#include "internal.h"

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem);
GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem);
typedef nvmlReturn_t (*info_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*info2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);

enum { INFO, INFO2, NFN };
static const char *const names[NFN] = {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"};
static void *const ours[NFN] = {(void *)&nvmlDeviceGetMemoryInfo, (void *)&nvmlDeviceGetMemoryInfo_v2};
static _Atomic(void *) real_fn[NFN];

/* NVML's own function: the one dlsym saw, else from the libnvidia-ml the process loaded. */
static void *real(int i)
{
    void *p = atomic_load_explicit(&real_fn[i], memory_order_acquire);
    if (p != NULL)
        return p;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL)
        return NULL;
    p = gs_real_dlsym(h, names[i]); /* the reference is kept: NVML must outlive the pointer */
    if (p == ours[i])
        p = NULL;
    if (p != NULL)
        atomic_store_explicit(&real_fn[i], p, memory_order_release);
    return p;
}

void *gs_nvml_dlsym(const char *name, void *found)
{
    int i = name[0] != 'n' ? NFN : !strcmp(name, names[INFO]) ? INFO : !strcmp(name, names[INFO2]) ? INFO2 : NFN;
    if (i == NFN)
        return found;
    if (found != ours[i])
        atomic_store_explicit(&real_fn[i], found, memory_order_release);
    else if (real(i) == NULL)
        return NULL; /* only our export answered: without NVML loaded the name does not exist */
    return gs_cap_any ? ours[i] : real(i);
}

/* The list form: the shared GPU an NVML handle is, by its UUID (GS_DEV_NONE: not shared, NVML's answer
 * unchanged). */
typedef nvmlReturn_t (*uuid_fn)(nvmlDevice_t, char *, unsigned int);
static void pick(nvmlDevice_t dev)
{
    if (GS_LIKELY(!gs_multi))
        return;
    static _Atomic(void *) uuid_p;
    void *p = atomic_load(&uuid_p);
    if (p == NULL) {
        void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
        p = h != NULL ? gs_real_dlsym(h, "nvmlDeviceGetUUID") : NULL;
        atomic_store(&uuid_p, p);
    }
    char u[96];
    gs_dev_cur = p != NULL && ((uuid_fn)p)(dev, u, sizeof(u)) == NVML_SUCCESS ? gs_dev_of_uuid(u) : GS_DEV_NONE;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    gs_init();
    info_fn fn = (info_fn)real(INFO);
    if (fn == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = fn(dev, mem);
    pick(dev);
    if (r != NVML_SUCCESS || mem == NULL || !gs_cap_on())
        return r;
    uint64_t t, f;
    gs_cap_report(mem->total, mem->free, &t, &f);
    mem->total = t;
    mem->free = f;
    mem->used = t - f;
    return r;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    gs_init();
    info2_fn fn = (info2_fn)real(INFO2);
    if (fn == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = fn(dev, mem);
    pick(dev);
    if (r != NVML_SUCCESS || mem == NULL || !gs_cap_on())
        return r;
    uint64_t t, f;
    gs_cap_report(mem->total, mem->free, &t, &f);
    mem->total = t;
    mem->free = f;
    mem->reserved = 0; /* the driver's reserve is outside the limit */
    mem->used = t - f;
    return r;
}
