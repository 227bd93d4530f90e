/*
 * The scheduler connection: connect with a deadline, HELLO/WELCOME (in
 * GS_PROTO_VERSION, stepping down one version at a time, to GS_SHIM_MIN_VERSION
 * at the oldest, while the scheduler refuses the HELLO by closing the
 * connection), and sending fixed-size messages in the connection's version. Every socket
 * operation is non-blocking and bounded, and MSG_NOSIGNAL keeps a dead
 * scheduler from raising SIGPIPE in the application.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gpushare_proto.h"
#include "internal.h"

uint64_t gs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The protocol version of each GPU's current connection (one at a time per GPU): every frame the shim
 * sends carries it, and the scheduler drops a client whose frames change version. */
static _Atomic uint16_t conn_versions[GS_DEV_SLOTS] = {[0 ... GS_DEV_SLOTS - 1] = GS_PROTO_VERSION};
#define conn_version (conn_versions[gs_dev_cur])

uint16_t gs_conn_version(void)
{
    return atomic_load(&conn_version);
}

static void header_v(void *msg, uint16_t version, uint16_t type, uint32_t size)
{
    struct gs_header h = {.magic = GS_PROTO_MAGIC, .version = version, .type = type, .size = size};
    memcpy(msg, &h, sizeof(h));
}

static void header(void *msg, uint16_t type, uint32_t size)
{
    header_v(msg, atomic_load(&conn_version), type, size);
}

static int send_all(int fd, const void *buf, size_t len)
{
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n == (ssize_t)len ? 0 : -1; /* messages are far below the socket buffer */
}

/* ACQUIRE (bytes = need) or RELEASE (epoch, bytes = resident kept). */
int gs_conn_send(int fd, uint16_t type, uint32_t epoch, uint64_t bytes)
{
    if (type == GS_MSG_ACQUIRE) {
        struct gs_acquire m;
        header(&m, GS_MSG_ACQUIRE, GS_ACQUIRE_SIZE);
        m.need = bytes;
        return send_all(fd, &m, sizeof(m));
    }
    struct gs_release m;
    memset(&m, 0, sizeof(m));
    header(&m, GS_MSG_RELEASE, GS_RELEASE_SIZE);
    m.epoch = epoch;
    m.resident = bytes;
    return send_all(fd, &m, sizeof(m));
}

/* Any message the caller built; the header is written here. */
int gs_conn_send_raw(int fd, void *msg, uint16_t type, uint32_t size)
{
    header(msg, type, size);
    return send_all(fd, msg, size);
}

static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = gs_now_ns();
        if (now >= deadline_ns)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)((deadline_ns - now) / 1000000ull) + 1);
        if (r > 0)
            return (p.revents & (events | POLLHUP | POLLERR)) ? 0 : -1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* One HELLO/WELCOME exchange in the given version on a new socket. Returns the socket, or -1; *closed
 * says the scheduler ended the connection after our HELLO without answering it (as one that does not
 * speak that version does), rather than being absent, slow or malformed. */
static int hello_once(uint16_t version, uint64_t deadline, struct gs_welcome *out, int *closed)
{
    *closed = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, gs_devs[gs_dev_cur].socket_path, sizeof(addr.sun_path) - 1);
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN)
            goto fail;
        int err = 0;
        socklen_t el = sizeof(err);
        if (wait_fd(fd, POLLOUT, deadline) != 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)
            goto fail;
    }

    struct gs_hello hello;
    memset(&hello, 0, sizeof(hello));
    header_v(&hello, version, GS_MSG_HELLO, GS_HELLO_SIZE);
    hello.pid = (uint32_t)getpid();
    hello.priority = gs_cfg.priority;
    memcpy(hello.gpu_uuid, gs_devs[gs_dev_cur].uuid, sizeof(hello.gpu_uuid));
    if (send_all(fd, &hello, sizeof(hello)) != 0) {
        *closed = errno == EPIPE || errno == ECONNRESET;
        goto fail;
    }

    struct gs_welcome w;
    size_t got = 0;
    while (got < sizeof(w)) {
        if (wait_fd(fd, POLLIN, deadline) != 0)
            goto fail;
        ssize_t n = recv(fd, (char *)&w + got, sizeof(w) - got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            *closed = got == 0 && (n == 0 || errno == ECONNRESET);
            goto fail;
        }
        if (n > 0)
            got += (size_t)n;
    }
    /* The scheduler answers in the client's version. */
    if (w.h.magic != GS_PROTO_MAGIC || w.h.version != version || w.h.type != GS_MSG_WELCOME ||
        w.h.size != GS_WELCOME_SIZE || w.mode > GS_MODE_OFF)
        goto fail;
    if (version >= 6) {
        /* the claim's ledger comes right behind the WELCOME, always (flags 0: none) */
        struct gs_ledger l;
        got = 0;
        while (got < sizeof(l)) {
            if (wait_fd(fd, POLLIN, deadline) != 0)
                goto fail;
            ssize_t n = recv(fd, (char *)&l + got, sizeof(l) - got, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                goto fail;
            if (n > 0)
                got += (size_t)n;
        }
        if (l.h.magic != GS_PROTO_MAGIC || l.h.version != version || l.h.type != GS_MSG_LEDGER ||
            l.h.size != GS_LEDGER_SIZE || (l.flags & ~(GS_LEDGER_ON | GS_LEDGER_REFUSED)) != 0 ||
            l.flags == (GS_LEDGER_ON | GS_LEDGER_REFUSED))
            goto fail;
        gs_cap_ledger_offer(&l);
    }
    *out = w;
    return fd;
fail:
    close(fd);
    return -1;
}

/* What a connection of an older version than the shim's does without, for the line that says so. */
static const char *lacks(uint16_t version)
{
    if (version >= 6)
        return "no release on completion (the idle window alone) and a launch bound in launches, not GPU time";
    if (version >= 5)
        return "no claim ledger (the per-process memory limit alone), a wait counts from its start whatever the "
               "scheduler says, and the environment's pacing settings hold";
    return version >= 4 ? "no scheduler idle window and no claim ledger, and a wait counts from its start"
                        : "no launch pacing, no scheduler idle window and no claim ledger, and a wait counts from its "
                          "start";
}

/* A close at a HELLO is a refusal of its version only when it comes again: a scheduler that is shutting
 * down (an agent restart or rollout) closes the connections it accepts meanwhile, and a shim that took
 * that for a refusal would speak an older protocol, without a claim ledger, for as long as its next
 * connection lasts. So a version is greeted HELLO_TRIES times, HELLO_RETRY_MS apart, before the next
 * older one: by then a scheduler that went away no longer listens (the attempt fails, and the gate
 * reconnects with backoff) or its successor answers. */
#define HELLO_TRIES 3
#define HELLO_RETRY_MS 20

/* Returns a connected, non-blocking socket that completed HELLO/WELCOME, or -1. The shim speaks
 * GS_PROTO_VERSION; a scheduler that closes the connection at that HELLO each time (an older one, which
 * refuses versions it does not know) is greeted again one version lower, down to GS_SHIM_MIN_VERSION,
 * all within the same deadline: the shim speaks the frames of each (a version 6 connection has no SETTLE
 * or PACE_TIME, a version 5 connection has no LEDGER, CHARGE, RETURN, PING, POLICY or PACING, a version 4
 * one no IDLE either, a version 3 one no PACE either). Anything but such a close (no answer, a malformed
 * one, nobody listening) ends the attempts. */
int gs_conn_open(struct gs_welcome *out)
{
    uint64_t deadline = gs_now_ns() + (uint64_t)gs_cfg.connect_timeout_ms * 1000000ull;
    int closed = 0, fd = -1, tries = 0;
    uint16_t v = GS_PROTO_VERSION;
    for (;;) {
        fd = hello_once(v, deadline, out, &closed);
        if (fd >= 0 || !closed)
            break;
        if (++tries < HELLO_TRIES) {
            if (gs_now_ns() + HELLO_RETRY_MS * 1000000ull >= deadline)
                break;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = HELLO_RETRY_MS * 1000000L};
            nanosleep(&ts, NULL);
            continue; /* the same version again */
        }
        if (v == GS_SHIM_MIN_VERSION)
            break;
        v--;
        tries = 0;
    }
    if (fd < 0)
        return -1;
    if (v != GS_PROTO_VERSION)
        gs_log(GS_LOG_INFO,
               "the GPU scheduler at %s speaks protocol %u (it closed the connection at a HELLO of version %u and "
               "later): %s",
               gs_devs[gs_dev_cur].socket_path, (unsigned)v, (unsigned)v + 1u, lacks(v));
    atomic_store(&conn_version, v);
    return fd;
}
