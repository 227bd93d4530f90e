/* Configuration: read once from the environment inside gs_init, never again. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

struct gs_config gs_cfg;

/* Defaults of the (policy) settings (internal.h). */
#define DEF_PACE_WAIT_MAX_MS 2000u
#define DEF_PACE_FULL_US 100u
#define DEF_WAIT_TIMEOUT_MS 600000u
#define DEF_MEMREPLY_TIMEOUT_MS 10000u
#define DEF_CONNECT_TIMEOUT_MS 1000u
#define DEF_RECONNECT_MAX_MS 1000u

/* What the environment asks for the (policy) settings, and the policy last put in force (-1: none yet). */
static struct {
    int64_t pace_override, pace_time_override_us;
    uint32_t pace_wait_max_ms, pace_full_us, wait_timeout_ms, memreply_timeout_ms;
    uint32_t connect_timeout_ms, reconnect_max_ms;
} env;
static int policy_allowed = -1;

static uint32_t env_u32(const char *name, uint32_t def)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return def;
    char *end = NULL;
    unsigned long n = strtoul(v, &end, 10);
    if (end == v || *end != '\0' || n > 0xffffffffUL) {
        gs_log(GS_LOG_WARN, "ignoring %s=%s: not a non-negative integer", name, v);
        return def;
    }
    return (uint32_t)n;
}

/* A byte count: decimal digits only (no sign, suffix or spaces), 0 when unset or empty. A malformed
 * value is ignored with one warning (the configuration is read once), so the process runs as if it
 * were unset: the shim fails open rather than refusing to start. */
static uint64_t env_bytes(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (*v < '0' || *v > '9' || end == v || *end != '\0' || errno == ERANGE) {
        gs_log(GS_LOG_WARN, "ignoring %s=%s: not a byte count (decimal digits, e.g. 8589934592)", name, v);
        return 0;
    }
    return n;
}

static void env_str(const char *name, char *dst, size_t cap, int *set)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return;
    if (strlen(v) >= cap) {
        gs_log(GS_LOG_WARN, "ignoring %s: longer than %zu bytes", name, cap - 1);
        return;
    }
    strcpy(dst, v);
    if (set)
        *set = 1;
}

static int parse_level(const char *v)
{
    if (v == NULL || *v == '\0')
        return GS_LOG_WARN;
    if (!strcasecmp(v, "error"))
        return GS_LOG_ERROR;
    if (!strcasecmp(v, "warn") || !strcasecmp(v, "warning"))
        return GS_LOG_WARN;
    if (!strcasecmp(v, "info"))
        return GS_LOG_INFO;
    if (!strcasecmp(v, "debug"))
        return GS_LOG_DEBUG;
    return GS_LOG_WARN;
}

static int parse_oversub(const char *v)
{
    return v != NULL && (!strcmp(v, "1") || !strcasecmp(v, "true"));
}

/* The single form: one GPU, slot 0, exactly the variables' values. */
static void dev_single(void)
{
    struct gs_dev *d = &gs_devs[0];
    env_str("GPUSHARE_SOCKET", d->socket_path, sizeof(d->socket_path), &d->socket_set);
    env_str("GPUSHARE_GPU_UUID", d->uuid, sizeof(d->uuid), NULL);
    d->oversub = parse_oversub(getenv("GPUSHARE_OVERSUB"));
    /* The container's memory claim, set per container by the DRA kubelet plugin (docs/shim.md). */
    d->memory_limit = env_bytes("GPUSHARE_MEMORY_LIMIT_BYTES");
    gs_ndevs = 1;
}

#define LIST_MAX 4096 /* the longest list read: 16 GPUs of a 40-byte UUID and a 108-byte path fit */

/* One item of a list form ("GPU-a=v,GPU-b=w"): the value for uuid, copied to out. 1: found, 0: the list
 * has none for it, -1: the list does not parse (an item without '=', an empty name or value, a name
 * twice, a value longer than cap - 1, the whole longer than LIST_MAX). */
static int list_get(const char *list, const char *uuid, char *out, size_t cap)
{
    if (list == NULL || *list == '\0')
        return 0;
    if (strlen(list) > LIST_MAX)
        return -1;
    int found = 0;
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq == NULL || eq == p || eq + 1 == p + len)
            return -1;
        size_t klen = (size_t)(eq - p), vlen = len - klen - 1;
        if (klen == strlen(uuid) && strncmp(p, uuid, klen) == 0) {
            if (found || vlen >= cap)
                return -1;
            memcpy(out, eq + 1, vlen);
            out[vlen] = '\0';
            found = 1;
        }
        /* a name twice, even one not ours, says the list is not what the agent writes */
        for (const char *q = list; q < p;) {
            const char *qe = strchr(q, ',');
            const char *qeq = memchr(q, '=', (size_t)(qe - q));
            if ((size_t)(qeq - q) == klen && strncmp(q, p, klen) == 0)
                return -1;
            q = qe + 1;
        }
        if (end == NULL)
            return found;
        p = end + 1;
    }
}

/* A GPU's value of a list-form variable; a list that does not parse leaves the GPU unshared (-1). */
static int dev_value(const char *name, const char *uuid, char *out, size_t cap)
{
    int r = list_get(getenv(name), uuid, out, cap);
    if (r < 0)
        gs_log(GS_LOG_WARN,
               "%s does not parse as the list form (uuid=value,... with each uuid once, at most %d bytes); %s is "
               "not shared: its calls pass through",
               name, LIST_MAX, uuid);
    return r;
}

static int parse_bytes(const char *v, uint64_t *n)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*v < '0' || *v > '9' || *end != '\0' || errno == ERANGE)
        return -1;
    *n = x;
    return 0;
}

/* The list form: GPUSHARE_GPU_UUID=GPU-a,GPU-b and per GPU its socket (required), oversubscription and
 * memory limit (docs/multigpu.md). A GPU whose entries are missing or malformed is left out of the table,
 * with a warning: its calls pass through; the process never fails for it. */
static void devs_list(const char *uuids)
{
    gs_multi = 1;
    gs_ndevs = 0;
    if (strlen(uuids) > LIST_MAX) {
        gs_log(GS_LOG_WARN, "GPUSHARE_GPU_UUID is longer than %d bytes: no GPU is shared", LIST_MAX);
        return;
    }
    /* Split first, so that a name given twice is found wherever the second one stands. */
    char buf[LIST_MAX + 1];
    char *item[LIST_MAX / 2 + 1];
    int n = 0;
    strcpy(buf, uuids);
    for (char *p = buf;;) {
        item[n++] = p;
        char *c = strchr(p, ',');
        if (c == NULL)
            break;
        *c = '\0';
        p = c + 1;
    }
    for (int i = 0; i < n; i++) {
        const char *u = item[i];
        if (*u == '\0' || strlen(u) >= sizeof(gs_devs[0].uuid) || strchr(u, '=') != NULL) {
            gs_log(GS_LOG_WARN, "GPUSHARE_GPU_UUID: ignoring \"%.64s\": not a GPU UUID", u);
            continue;
        }
        int dup = 0;
        for (int j = 0; j < n; j++)
            dup |= j != i && strcmp(item[j], u) == 0;
        if (dup) {
            gs_log(GS_LOG_WARN, "GPUSHARE_GPU_UUID names %s more than once: it is not shared, its calls pass through",
                   u);
            continue;
        }
        if (gs_ndevs == GS_MAX_DEVS) {
            gs_log(GS_LOG_WARN, "GPUSHARE_GPU_UUID names more than %d GPUs: %s is not shared", GS_MAX_DEVS, u);
            continue;
        }
        struct gs_dev d;
        memset(&d, 0, sizeof(d));
        strcpy(d.uuid, u);
        char v[128];
        int r = dev_value("GPUSHARE_SOCKET", u, d.socket_path, sizeof(d.socket_path));
        if (r == 0)
            gs_log(GS_LOG_WARN, "GPUSHARE_SOCKET has no socket for %s: it is not shared, its calls pass through", u);
        if (r <= 0)
            continue;
        d.socket_set = 1;
        r = dev_value("GPUSHARE_OVERSUB", u, v, sizeof(v));
        if (r < 0)
            continue;
        d.oversub = r == 1 && parse_oversub(v);
        r = dev_value("GPUSHARE_MEMORY_LIMIT_BYTES", u, v, sizeof(v));
        if (r < 0)
            continue;
        if (r == 1 && parse_bytes(v, &d.memory_limit) != 0) {
            gs_log(GS_LOG_WARN,
                   "GPUSHARE_MEMORY_LIMIT_BYTES: %s=%s is not a byte count: %s is not shared, its calls pass "
                   "through",
                   u, v, u);
            continue;
        }
        gs_devs[gs_ndevs++] = d;
    }
}

static void devs_load(void)
{
    memset(gs_devs, 0, sizeof(gs_devs));
    gs_multi = 0;
    const char *uuids = getenv("GPUSHARE_GPU_UUID");
    if (uuids != NULL && strchr(uuids, ',') != NULL)
        devs_list(uuids);
    else
        dev_single();
    int any = 0;
    for (int i = 0; i < gs_ndevs; i++)
        any |= gs_devs[i].memory_limit != 0;
    gs_cap_any = any;
}

void gs_config_load(void)
{
    memset(&gs_cfg, 0, sizeof(gs_cfg));
    gs_cfg.log_level = parse_level(getenv("GPUSHARE_LOG_LEVEL"));
    strcpy(gs_cfg.cuda_library, "libcuda.so.1");
    env_str("GPUSHARE_CUDA_LIBRARY", gs_cfg.cuda_library, sizeof(gs_cfg.cuda_library), NULL);

    const char *prio = getenv("GPUSHARE_PRIORITY");
    gs_cfg.priority = 0;
    if (prio != NULL && (!strcasecmp(prio, "high") || !strcmp(prio, "1")))
        gs_cfg.priority = 1;

    gs_cfg.quantum_ms = env_u32("GPUSHARE_QUANTUM_MS", 0);
    /* GPUSHARE_IDLE_US, when set, wins: a window under a millisecond, for an inference server whose
     * gaps between requests are that short (make bench-qos measures what it costs production). */
    uint32_t idle_ms = env_u32("GPUSHARE_IDLE_MS", 50);
    if (idle_ms == 0)
        idle_ms = 1;
    gs_cfg.idle_us = idle_ms > 0xffffffffu / 1000u ? 0xffffffffu : idle_ms * 1000u;
    gs_cfg.idle_us = env_u32("GPUSHARE_IDLE_US", gs_cfg.idle_us);
    if (gs_cfg.idle_us < GS_IDLE_MIN_US)
        gs_cfg.idle_us = GS_IDLE_MIN_US; /* below the kernel's timer slack a shorter window is not kept */
    gs_cfg.restore_wait_ms = env_u32("GPUSHARE_RESTORE_WAIT_MS", 30000);
    atomic_store(&gs_count_calls, gs_cfg.log_level >= GS_LOG_DEBUG);

    /* Segments of 256 MiB: each costs a cuMemCreate + map and a release per swap (~0.1-0.2 ms on the H100,
     * ~3 ms for a 6 GiB allocation against ~120 ms of copying), and an eviction moves at most one more. */
    gs_cfg.segment_bytes = (uint64_t)env_u32("GPUSHARE_SEGMENT_MIB", 256) << 20;
    gs_cfg.budget_cap = env_bytes("GPUSHARE_BUDGET_BYTES");
    devs_load();
    /* For measuring: a launch bound in force whatever the scheduler says ("0": none at all). */
    env.pace_override = -1;
    const char *po = getenv("GPUSHARE_PACE_OVERRIDE");
    if (po != NULL && *po != '\0')
        env.pace_override = env_u32("GPUSHARE_PACE_OVERRIDE", UINT32_MAX);
    if (env.pace_override == UINT32_MAX)
        env.pace_override = -1; /* malformed (warned about): the scheduler's bound */
    /* The same for the bound in GPU time, in us ("0": the count bound alone). */
    env.pace_time_override_us = -1;
    const char *pt = getenv("GPUSHARE_PACE_TIME_OVERRIDE_US");
    if (pt != NULL && *pt != '\0')
        env.pace_time_override_us = env_u32("GPUSHARE_PACE_TIME_OVERRIDE_US", UINT32_MAX);
    if (env.pace_time_override_us == UINT32_MAX)
        env.pace_time_override_us = -1;
    env.pace_wait_max_ms = env_u32("GPUSHARE_PACE_WAIT_MAX_MS", DEF_PACE_WAIT_MAX_MS);
    if (env.pace_wait_max_ms == 0)
        env.pace_wait_max_ms = 1; /* never unbounded */
    /* A paced launch that runs shorter than this counts as the fraction of a launch it runs (pace.c); 0:
     * each counts as one. Why 100 us, and its cost against 0: docs/shim.md, "Launch pacing". */
    env.pace_full_us = env_u32("GPUSHARE_PACE_FULL_US", DEF_PACE_FULL_US);
    env.wait_timeout_ms = env_u32("GPUSHARE_WAIT_TIMEOUT_MS", DEF_WAIT_TIMEOUT_MS);
    env.memreply_timeout_ms = env_u32("GPUSHARE_MEMREPLY_TIMEOUT_MS", DEF_MEMREPLY_TIMEOUT_MS);
    if (env.memreply_timeout_ms == 0)
        env.memreply_timeout_ms = 1; /* never unbounded */
    env.connect_timeout_ms = env_u32("GPUSHARE_CONNECT_TIMEOUT_MS", DEF_CONNECT_TIMEOUT_MS);
    env.reconnect_max_ms = env_u32("GPUSHARE_RECONNECT_MAX_MS", DEF_RECONNECT_MAX_MS);
    if (env.reconnect_max_ms < 10)
        env.reconnect_max_ms = 10;
    policy_allowed = -1;
    gs_config_env_policy(1, 0); /* until a scheduler of protocol 6 says otherwise: no scheduler enforces anything */
}

/* The (policy) settings as the environment asks them, and their defaults. A pod controls its environment;
 * where the GPU's scheduler does not allow it (the agent's never does for pods, the standalone one for
 * benchmarks does), a value that weakens the lock for the others is not taken: no bound or a looser one
 * (PACE_OVERRIDE, a larger PACE_FULL_US), pacing given up sooner (a shorter PACE_WAIT_MAX_MS), the lock
 * given up sooner (a shorter WAIT_TIMEOUT_MS: pass-through; a shorter MEMREPLY_TIMEOUT_MS: the connection
 * dropped, the process unlocked until it reconnects). A stricter value is taken, like GPUSHARE_IDLE_US and
 * GPUSHARE_QUANTUM_MS, which only ever make the process yield sooner. */
void gs_config_env_policy(int allowed, int said)
{
    int weakened = 0;
    char ignored[256] = "";
#define TAKE_IF(ok, field, name, stricter)                                                                    \
    do {                                                                                                     \
        if ((ok) || (stricter)) {                                                                            \
            gs_cfg.field = env.field;                                                                        \
        } else {                                                                                             \
            gs_cfg.field = def_##field;                                                                      \
            weakened = 1;                                                                                    \
            snprintf(ignored + strlen(ignored), sizeof(ignored) - strlen(ignored), " %s=%lld", name,        \
                     (long long)env.field);                                                                  \
        }                                                                                                    \
    } while (0)
#define TAKE(field, name, stricter) TAKE_IF(allowed, field, name, stricter)
    const int64_t def_pace_override = -1;
    const uint32_t def_pace_full_us = DEF_PACE_FULL_US, def_pace_wait_max_ms = DEF_PACE_WAIT_MAX_MS;
    const uint32_t def_wait_timeout_ms = DEF_WAIT_TIMEOUT_MS, def_memreply_timeout_ms = DEF_MEMREPLY_TIMEOUT_MS;
    TAKE(pace_override, "GPUSHARE_PACE_OVERRIDE", env.pace_override < 0);
    const int64_t def_pace_time_override_us = -1;
    TAKE(pace_time_override_us, "GPUSHARE_PACE_TIME_OVERRIDE_US", env.pace_time_override_us < 0);
    TAKE(pace_full_us, "GPUSHARE_PACE_FULL_US", env.pace_full_us <= DEF_PACE_FULL_US);
    TAKE(pace_wait_max_ms, "GPUSHARE_PACE_WAIT_MAX_MS", env.pace_wait_max_ms >= DEF_PACE_WAIT_MAX_MS);
    TAKE(wait_timeout_ms, "GPUSHARE_WAIT_TIMEOUT_MS",
         env.wait_timeout_ms == 0 || env.wait_timeout_ms >= DEF_WAIT_TIMEOUT_MS);
    TAKE(memreply_timeout_ms, "GPUSHARE_MEMREPLY_TIMEOUT_MS", env.memreply_timeout_ms >= DEF_MEMREPLY_TIMEOUT_MS);
    /* The connection's own timings count before any scheduler can say POLICY, so only a scheduler that
     * said so lets them loosen: until then a pod may wait longer for a WELCOME and try again sooner, never
     * give its first connect up sooner (too short for a scheduler busy with pod lookups) or stay away
     * longer after a restart. */
    const uint32_t def_connect_timeout_ms = DEF_CONNECT_TIMEOUT_MS, def_reconnect_max_ms = DEF_RECONNECT_MAX_MS;
    TAKE_IF(allowed && said, connect_timeout_ms, "GPUSHARE_CONNECT_TIMEOUT_MS",
            env.connect_timeout_ms >= DEF_CONNECT_TIMEOUT_MS);
    TAKE_IF(allowed && said, reconnect_max_ms, "GPUSHARE_RECONNECT_MAX_MS", env.reconnect_max_ms <= DEF_RECONNECT_MAX_MS);
#undef TAKE
#undef TAKE_IF
    if (weakened && said && policy_allowed != allowed)
        gs_log(GS_LOG_WARN,
               "the GPU scheduler does not let this pod's environment loosen the GPU lock; ignoring%s (their "
               "defaults hold)",
               ignored);
    policy_allowed = said ? allowed : -1;
    gs_pace_reapply();
}
