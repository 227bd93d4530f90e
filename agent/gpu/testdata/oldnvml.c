/* A driver library (libnvidia-ml.so.1) that lacks functions the agent uses where present: here
 * nvmlDeviceGetMemoryInfo_v2 (drivers before R510) and MIG's functions. Two GPUs, no processes.
 * Built and loaded by TestAnOlderDriverLibraryIsReadNotCalledPast (symbols_lib_test.go). */
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

static char gpus[2];

nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { return r ? "error" : "Success"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned n) { snprintf(v, n, "470.256.02"); return 0; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 11040; return 0; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 11040; return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (i >= 2)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *d = &gpus[i];
    return 0;
}
static int index_of(nvmlDevice_t d) { return (int)((char *)d - gpus); }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    for (int i = 0; i < 2; i++) {
        char u[64];
        snprintf(u, sizeof u, "GPU-0000000%d-old0-0000-0000-000000000000", i);
        if (strcmp(u, uuid) == 0) {
            *d = &gpus[i];
            return 0;
        }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) { *i = index_of(d); return 0; }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned n) {
    snprintf(u, n, "GPU-0000000%d-old0-0000-0000-000000000000", index_of(d));
    return 0;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned n) { snprintf(name, n, "Tesla T4"); return 0; }
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned *m) { *m = index_of(d); return 0; }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    m->total = 16ull << 30;
    m->used = 0;
    m->free = m->total;
    return 0;
}
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *mode) { *mode = 0; return 0; }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned *count, void *infos) {
    *count = 0;
    return 0;
}
