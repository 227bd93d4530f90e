/*
 * A stub libnvidia-ml.so.1 for the memory limit's tests: one GPU of 80 GiB, 70 GiB free, and the
 * few calls the tests make. The numbers are fixed so that a test can tell the shim's answer from
 * NVML's.
 */
#define STUB_EXPORT __attribute__((visibility("default")))

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define GIB (1ull << 30)

STUB_EXPORT int nvmlInit_v2(void);
STUB_EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev);
STUB_EXPORT int nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m);
STUB_EXPORT int nvmlDeviceGetMemoryInfo_v2(void *dev, nvmlMemory_v2_t *m);

STUB_EXPORT int nvmlInit_v2(void)
{
    return 0;
}

STUB_EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev)
{
    if (i != 0)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *dev = (void *)0x4e564d4c;
    return 0;
}

STUB_EXPORT int nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m)
{
    if (dev != (void *)0x4e564d4c || m == 0)
        return 2;
    m->total = 80 * GIB;
    m->free = 70 * GIB;
    m->used = 10 * GIB;
    return 0;
}

STUB_EXPORT int nvmlDeviceGetMemoryInfo_v2(void *dev, nvmlMemory_v2_t *m)
{
    if (dev != (void *)0x4e564d4c || m == 0 || m->version != (unsigned)(sizeof(*m) | 2u << 24))
        return 2;
    m->total = 80 * GIB;
    m->reserved = GIB;
    m->free = 70 * GIB;
    m->used = 9 * GIB;
    return 0;
}
