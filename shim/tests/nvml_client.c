/*
 * NVML's memory queries under the memory limit, on the stub driver and the stub NVML. Allocates
 * 16 MiB with cuMemAlloc, then asks NVML three ways: v1 and v2 through dlsym on the
 * libnvidia-ml handle (as ctypes and PyTorch do), and v1 through the direct link this program has
 * to libnvidia-ml.so.1. Prints
 *   nvml v1 T/F/U v2 T/F/U direct T/F/U
 * (total/free/used bytes).
 *   nvml_client multi   (GPUSHARE_STUB_DEVICES=2) allocates 16 MiB on device 1 (its primary context
 *                       current), then asks NVML (v1 and v2 through dlsym) for each device in turn; prints
 *   nvml multi dev0 T/F/U T/F/U dev1 T/F/U T/F/U
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev);
int nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m);

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setctx_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef int (*info_fn)(void *, nvmlMemory_t *);
typedef int (*info2_fn)(void *, nvmlMemory_v2_t *);

/* Device 1's 16 MiB, then each device's memory as NVML reports it (v1 and v2). */
static int multi(void *cuda, void *nvml)
{
    CUcontext c = NULL;
    CUdeviceptr d;
    if (((retain_fn)dlsym(cuda, "cuDevicePrimaryCtxRetain"))(&c, 1) != CUDA_SUCCESS ||
        ((setctx_fn)dlsym(cuda, "cuCtxSetCurrent"))(c) != CUDA_SUCCESS ||
        ((alloc_fn)dlsym(cuda, "cuMemAlloc_v2"))(&d, 16 << 20) != CUDA_SUCCESS) {
        fprintf(stderr, "nvml_client: no memory on device 1\n");
        return 2;
    }
    nvmlInit_v2();
    info_fn i1 = (info_fn)dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    info2_fn i2 = (info2_fn)dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
    printf("nvml multi");
    for (unsigned int i = 0; i < 2; i++) {
        void *dev = NULL;
        nvmlMemory_t m1 = {0};
        nvmlMemory_v2_t m2 = {.version = (unsigned)(sizeof(m2) | 2u << 24)};
        if (nvmlDeviceGetHandleByIndex_v2(i, &dev) != 0 || i1 == NULL || i2 == NULL || i1(dev, &m1) != 0 ||
            i2(dev, &m2) != 0) {
            fprintf(stderr, "nvml_client: NVML refused device %u\n", i);
            return 1;
        }
        printf(" dev%u %llu/%llu/%llu %llu/%llu/%llu", i, m1.total, m1.free, m1.used, m2.total, m2.free, m2.used);
    }
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda == NULL || nvml == NULL) {
        fprintf(stderr, "nvml_client: %s\n", dlerror());
        return 2;
    }
    ((init_fn)dlsym(cuda, "cuInit"))(0);
    if (argc > 1 && strcmp(argv[1], "multi") == 0)
        return multi(cuda, nvml);
    CUdeviceptr d;
    if (((alloc_fn)dlsym(cuda, "cuMemAlloc_v2"))(&d, 16 << 20) != CUDA_SUCCESS) {
        fprintf(stderr, "nvml_client: cuMemAlloc failed\n");
        return 2;
    }
    void *dev = NULL;
    nvmlInit_v2();
    nvmlDeviceGetHandleByIndex_v2(0, &dev);
    nvmlMemory_t m1 = {0}, md = {0};
    nvmlMemory_v2_t m2 = {.version = (unsigned)(sizeof(m2) | 2u << 24)};
    info_fn i1 = (info_fn)dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    info2_fn i2 = (info2_fn)dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
    int r1 = i1 ? i1(dev, &m1) : -1, r2 = i2 ? i2(dev, &m2) : -1, rd = nvmlDeviceGetMemoryInfo(dev, &md);
    if (r1 != 0 || r2 != 0 || rd != 0) {
        fprintf(stderr, "nvml_client: v1 %d v2 %d direct %d\n", r1, r2, rd);
        return 1;
    }
    printf("nvml v1 %llu/%llu/%llu v2 %llu/%llu/%llu direct %llu/%llu/%llu\n", m1.total, m1.free, m1.used, m2.total,
           m2.free, m2.used, md.total, md.free, md.used);
    return 0;
}
