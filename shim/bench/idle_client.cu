// Idle release: launches kernels for BUSY_MS, waits for them, prints the
// CLOCK_MONOTONIC time of the end of its last GPU work, then stays alive
// (idle) for IDLE_MS so the shim's idle release, not process exit, frees the lock.
//   idle_client BUSY_MS IDLE_MS
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>

#include <cuda_runtime.h>

__global__ void spin(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

static long long now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long busy_ms = argc > 1 ? atol(argv[1]) : 300;
    long idle_ms = argc > 2 ? atol(argv[2]) : 1000;
    cudaFree(0);
    spin<<<1, 1>>>(1); // first GPU call: takes the lock
    cudaDeviceSynchronize();
    printf("busy\n");
    fflush(stdout);
    long long end = now_ns() + busy_ms * 1000000LL;
    while (now_ns() < end) {
        spin<<<1, 1>>>(100000);
        cudaDeviceSynchronize();
    }
    long long last = now_ns();
    printf("last_work_ns=%lld\n", last);
    fflush(stdout);
    usleep((useconds_t)(idle_ms * 1000));
    return 0;
}
