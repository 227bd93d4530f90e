/*
 * The soak's client (test/soak), on the stub driver: one process of a pod that follows commands, one a
 * line on stdin, and answers each with one line on stdout once it is done:
 *
 *   ctx D          retain device D's primary context       -> "ctx D r=R"
 *   alloc D N      cuMemAlloc_v2 of N bytes on device D     -> "alloc D r=R"
 *   free D         free every allocation on device D        -> "free D n=K"
 *   launch D K     K kernel launches on device D, then wait -> "launch D r=R"
 *   drop           free everything, then exec itself without LD_PRELOAD (a process that drops the
 *                  shim: what it does next no scheduler sees) -> "drop" from the new image
 *   lie SOCKET N   a second connection of this process to the scheduler at SOCKET, bypassing the shim:
 *                  HELLO, then RETURN flags HOLD of N bytes (a grant it never had), held open until the
 *                  process ends -> "lie r=0" (r=1: no connection)
 *   exit           -> "exit", then the process ends
 *
 * A result R is the driver's (0: success; 2: out of memory, as the shim answers past a claim). The
 * process never exits on an error: what the shim refuses, the soak checks.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "gpushare_proto.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setcur_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

#define MAXDEV 16
#define MAXALLOC 1024

static struct {
    CUdeviceptr p;
    int dev;
} allocs[MAXALLOC];
static CUcontext ctxs[MAXDEV];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* One line of stdin, read a byte at a time: nothing is buffered past it, so after "drop" the new image
 * reads the commands that follow. */
static int read_line(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r <= 0)
            return n > 0 ? (int)n : -1;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            buf[n++] = c;
    }
    buf[n] = 0;
    return (int)n;
}

static struct gs_header hdr(uint16_t type, uint32_t size)
{
    struct gs_header h = {.magic = GS_PROTO_MAGIC, .version = GS_PROTO_VERSION, .type = type, .size = size};
    return h;
}

/* The lie: a connection that announces a grant of n bytes it never had. The fd stays open. */
static int lie(const char *path, uint64_t n)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path))
        return 1;
    strcpy(a.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return 1;
    }
    struct gs_hello h;
    memset(&h, 0, sizeof(h));
    h.h = hdr(GS_MSG_HELLO, GS_HELLO_SIZE);
    h.pid = (uint32_t)getpid();
    struct gs_return r;
    memset(&r, 0, sizeof(r));
    r.h = hdr(GS_MSG_RETURN, GS_RETURN_SIZE);
    r.flags = GS_RETURN_HOLD;
    r.bytes = n;
    if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h) || write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r)) {
        close(fd);
        return 1;
    }
    return 0; /* left open: the lie lasts as long as the process */
}

int main(int argc, char **argv)
{
    (void)argc;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "soak_client: %s\n", dlerror());
        return 2;
    }
    ((init_fn)dlsym(lib, "cuInit"))(0);
    retain_fn retain = (retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    setcur_fn setcur = (setcur_fn)dlsym(lib, "cuCtxSetCurrent");
    alloc_fn alloc = (alloc_fn)dlsym(lib, "cuMemAlloc_v2");
    free_fn release = (free_fn)dlsym(lib, "cuMemFree_v2");
    sync_fn sync = (sync_fn)dlsym(lib, "cuCtxSynchronize");
    launch_fn launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    if (getenv("SOAK_DROPPED") != NULL)
        say("drop");

    char line[256];
    while (read_line(line, sizeof(line)) >= 0) {
        char cmd[32] = {0};
        long long a = 0, b = 0;
        int n = sscanf(line, "%31s %lld %lld", cmd, &a, &b);
        if (n < 1)
            continue;
        if (!strcmp(cmd, "lie")) {
            char path[200] = {0};
            unsigned long long bytes = 0;
            int r = sscanf(line, "lie %199s %llu", path, &bytes) == 2 ? lie(path, bytes) : 1;
            say("lie r=%d", r);
            continue;
        }
        int d = (int)a;
        if (n >= 2 && (d < 0 || d >= MAXDEV)) {
            say("%s %d r=1", cmd, d);
            continue;
        }
        if (!strcmp(cmd, "ctx")) {
            CUresult r = ctxs[d] != NULL ? CUDA_SUCCESS : retain(&ctxs[d], d);
            if (r != CUDA_SUCCESS)
                ctxs[d] = NULL;
            say("ctx %d r=%d", d, r);
        } else if (!strcmp(cmd, "alloc")) {
            CUresult r = CUDA_ERROR_INVALID_VALUE;
            int slot = -1;
            for (int i = 0; i < MAXALLOC && slot < 0; i++)
                if (allocs[i].p == 0)
                    slot = i;
            if (ctxs[d] != NULL && slot >= 0 && setcur(ctxs[d]) == CUDA_SUCCESS) {
                r = alloc(&allocs[slot].p, (size_t)b);
                if (r == CUDA_SUCCESS)
                    allocs[slot].dev = d;
                else
                    allocs[slot].p = 0;
            }
            say("alloc %d r=%d", d, r);
        } else if (!strcmp(cmd, "free")) {
            int k = 0;
            if (ctxs[d] != NULL && setcur(ctxs[d]) == CUDA_SUCCESS)
                for (int i = 0; i < MAXALLOC; i++)
                    if (allocs[i].p != 0 && allocs[i].dev == d) {
                        release(allocs[i].p);
                        allocs[i].p = 0;
                        k++;
                    }
            say("free %d n=%d", d, k);
        } else if (!strcmp(cmd, "launch")) {
            CUresult r = CUDA_ERROR_INVALID_VALUE;
            if (ctxs[d] != NULL && setcur(ctxs[d]) == CUDA_SUCCESS) {
                r = CUDA_SUCCESS;
                for (long long i = 0; i < b && r == CUDA_SUCCESS; i++)
                    r = launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                CUresult s = sync();
                if (r == CUDA_SUCCESS)
                    r = s;
            }
            say("launch %d r=%d", d, r);
        } else if (!strcmp(cmd, "drop")) {
            for (int i = 0; i < MAXALLOC; i++)
                if (allocs[i].p != 0) {
                    setcur(ctxs[allocs[i].dev]);
                    release(allocs[i].p);
                    allocs[i].p = 0;
                }
            fflush(stdout);
            unsetenv("LD_PRELOAD");
            setenv("SOAK_DROPPED", "1", 1);
            execv("/proc/self/exe", argv);
            say("drop failed");
        } else if (!strcmp(cmd, "exit")) {
            say("exit");
            return 0;
        } else {
            say("%s unknown", cmd);
        }
    }
    return 0;
}
