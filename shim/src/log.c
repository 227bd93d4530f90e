/* Logging to stderr with one write(2) per line, so lines of threads never interleave. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void gs_log(int level, const char *fmt, ...)
{
    if (level > gs_cfg.log_level)
        return;
    char buf[512];
    /* wall-clock time, to line up with the application's own timestamps and other processes' logs */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf(buf, sizeof(buf), "gpushare[%d] %lld.%03ld %s: ", (int)getpid(), (long long)ts.tv_sec,
                     ts.tv_nsec / 1000000, level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m;
    if ((size_t)n > sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

/* Set once the process was told it runs without the lock: later pass-throughs log at debug level. */
static atomic_int failopen_told;

void gs_note_no_lock(const char *reason)
{
    atomic_store(&failopen_told, 1);
    gs_log(GS_LOG_INFO, "no GPU lock: %s", reason);
}

void gs_warn_failopen(const char *reason)
{
    if (atomic_exchange(&failopen_told, 1) == 0)
        gs_log(GS_LOG_WARN, "GPU lock disabled, passing CUDA calls straight to the driver: %s", reason);
    else
        gs_log(GS_LOG_DEBUG, "pass-through: %s", reason);
}
