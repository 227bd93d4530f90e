// Launch tax: time of one empty-kernel launch call, through the driver API
// (cuLaunchKernel, linked directly, as a library calling the driver would)
// and through the runtime (<<<>>>, which reaches the driver via
// cuGetProcAddress). Synchronizes every 256 launches so the queue never
// fills; those iterations are not timed.
//   launch_bench [N]   prints p50/p90/p99 in ns for both paths
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

__global__ void empty_kernel() {}

static long long now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void report(const char *what, std::vector<long long> &t)
{
    std::sort(t.begin(), t.end());
    size_t n = t.size();
    printf("%s: n=%zu p50=%lldns p90=%lldns p99=%lldns\n", what, n, t[n / 2], t[n * 9 / 10], t[n * 99 / 100]);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    if (cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    cudaFunction_t rf;
    if (cudaGetFuncBySymbol(&rf, (const void *)empty_kernel) != cudaSuccess) {
        fprintf(stderr, "cudaGetFuncBySymbol failed\n");
        return 1;
    }
    CUfunction f = (CUfunction)rf;
    std::vector<long long> drv, rt;
    drv.reserve(n);
    rt.reserve(n);
    for (int i = 0; i < 2000; i++) // warm-up, and take the lock
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, nullptr, nullptr);
    cuCtxSynchronize();
    for (int i = 0; i < n; i++) {
        long long t0 = now_ns();
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, nullptr, nullptr);
        long long t1 = now_ns();
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "cuLaunchKernel = %d\n", (int)r);
            return 1;
        }
        if ((i & 255) == 255)
            cuCtxSynchronize();
        else
            drv.push_back(t1 - t0);
    }
    for (int i = 0; i < n; i++) {
        long long t0 = now_ns();
        empty_kernel<<<1, 1>>>();
        long long t1 = now_ns();
        if ((i & 255) == 255)
            cudaDeviceSynchronize();
        else
            rt.push_back(t1 - t0);
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "kernel failed\n");
        return 1;
    }
    report("cuLaunchKernel", drv);
    report("runtime <<<>>>", rt);
    return 0;
}
