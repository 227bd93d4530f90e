/*
 * A stub libnvidia-ml.so.1 for the memory limit's tests, and the few calls they make. The numbers are
 * fixed so that a test can tell the shim's answer from NVML's. GPUSHARE_STUB_DEVICES=n (default 1), as
 * the stub driver: n devices, device d with the driver stub's UUID (GPU-00000000-0000-0000-0000-
 * 0000000000dd) and 80 - 16 d GiB, 10 GiB of them used (v2: 1 GiB reserved, 9 GiB used).
 */
#include <stdio.h>
#include <stdlib.h>

#define STUB_EXPORT __attribute__((visibility("default")))

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define GIB (1ull << 30)
#define HANDLE0 0x4e564d4cul /* device d's handle is HANDLE0 + d */

STUB_EXPORT int nvmlInit_v2(void);
STUB_EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev);
STUB_EXPORT int nvmlDeviceGetUUID(void *dev, char *uuid, unsigned int len);
STUB_EXPORT int nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m);
STUB_EXPORT int nvmlDeviceGetMemoryInfo_v2(void *dev, nvmlMemory_v2_t *m);

static int ndevices(void)
{
    const char *v = getenv("GPUSHARE_STUB_DEVICES");
    int n = v != NULL ? atoi(v) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : n;
}

/* The device of handle dev, or -1. */
static int index_of(void *dev)
{
    unsigned long d = (unsigned long)dev - HANDLE0;
    return (unsigned long)dev >= HANDLE0 && d < (unsigned long)ndevices() ? (int)d : -1;
}

STUB_EXPORT int nvmlInit_v2(void)
{
    return 0;
}

STUB_EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev)
{
    if (i >= (unsigned int)ndevices())
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *dev = (void *)(HANDLE0 + i);
    return 0;
}

STUB_EXPORT int nvmlDeviceGetUUID(void *dev, char *uuid, unsigned int len)
{
    int d = index_of(dev);
    if (d < 0 || uuid == NULL)
        return 2;
    if (snprintf(uuid, len, "GPU-00000000-0000-0000-0000-0000000000%02x", d) >= (int)len)
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    return 0;
}

STUB_EXPORT int nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m)
{
    int d = index_of(dev);
    if (d < 0 || m == 0)
        return 2;
    m->total = (80 - 16 * (unsigned long long)d) * GIB;
    m->used = 10 * GIB;
    m->free = m->total - m->used;
    return 0;
}

STUB_EXPORT int nvmlDeviceGetMemoryInfo_v2(void *dev, nvmlMemory_v2_t *m)
{
    int d = index_of(dev);
    if (d < 0 || m == 0 || m->version != (unsigned)(sizeof(*m) | 2u << 24))
        return 2;
    m->total = (80 - 16 * (unsigned long long)d) * GIB;
    m->reserved = GIB;
    m->free = m->total - 10 * GIB;
    m->used = 9 * GIB;
    return 0;
}
