/*
 * A raw protocol peer for tests and the hand-off benchmark: speaks
 * gpushare_proto.h directly, without the shim.
 *   proto_peer SOCKET hold MS          acquire, print "granted", keep the lock MS ms
 *                                      without releasing (ignores CONTENDED), print "revoked"
 *                                      if told, exit
 *   proto_peer SOCKET handoff N        two connections ping-pong the lock N times; prints
 *                                      release->grant latency p50/p99/max in microseconds
 *   proto_peer SOCKET waitgrant        acquire once; print "grant_ns=<CLOCK_MONOTONIC ns>"
 * It speaks GS_PROTO_VERSION, and steps down a version at a time to a scheduler that closes the
 * connection at a HELLO (an older one), down to 3, as the shim does; PACE and IDLE messages (versions
 * 4 and 5) are read and ignored.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gpushare_proto.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint16_t version = GS_PROTO_VERSION; /* of every frame sent, once a connection is set up */

static void hdr(void *msg, uint16_t type, uint32_t size)
{
    struct gs_header h = {.magic = GS_PROTO_MAGIC, .version = version, .type = type, .size = size};
    memcpy(msg, &h, sizeof(h));
}

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* Reads one message into buf (>= GS_MAX_MSG_SIZE); returns its type or -1. */
static int read_msg(int fd, unsigned char *buf)
{
    if (read_full(fd, buf, GS_HEADER_SIZE) != 0)
        return -1;
    struct gs_header h;
    memcpy(&h, buf, sizeof(h));
    if (h.magic != GS_PROTO_MAGIC || h.size < GS_HEADER_SIZE || h.size > GS_MAX_MSG_SIZE)
        return -1;
    if (read_full(fd, buf + GS_HEADER_SIZE, h.size - GS_HEADER_SIZE) != 0)
        return -1;
    return h.type;
}

/* Connects and says HELLO in the current version; the socket, or -1 when the scheduler closed it
 * without WELCOME. */
static int dial_once(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path, sizeof(a.sun_path) - 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("connect");
        exit(2);
    }
    struct gs_hello h;
    memset(&h, 0, sizeof(h));
    hdr(&h, GS_MSG_HELLO, GS_HELLO_SIZE);
    h.pid = (uint32_t)getpid();
    if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
        exit(2);
    unsigned char buf[GS_MAX_MSG_SIZE];
    if (read_msg(fd, buf) != GS_MSG_WELCOME) {
        close(fd);
        return -1;
    }
    return fd;
}

static int dial(const char *path)
{
    int fd = dial_once(path);
    while (fd < 0 && version > 3) {
        version--;
        fd = dial_once(path);
    }
    if (fd < 0) {
        fprintf(stderr, "no welcome\n");
        exit(2);
    }
    return fd;
}

/* The next message that is not PACE or IDLE (a launch bound and an idle window, which this peer
 * ignores). */
static int read_msg_skip_pace(int fd, unsigned char *buf)
{
    int t;
    while ((t = read_msg(fd, buf)) == GS_MSG_PACE || t == GS_MSG_IDLE)
        ;
    return t;
}

static void send_acquire(int fd)
{
    struct gs_acquire m;
    memset(&m, 0, sizeof(m));
    hdr(&m, GS_MSG_ACQUIRE, GS_ACQUIRE_SIZE);
    if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m))
        exit(2);
}

static void send_release(int fd, uint32_t epoch)
{
    struct gs_release m;
    memset(&m, 0, sizeof(m));
    hdr(&m, GS_MSG_RELEASE, GS_RELEASE_SIZE);
    m.epoch = epoch;
    if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m))
        exit(2);
}

/* Waits for GRANT, skipping CONTENDED; returns the epoch. */
static uint32_t wait_grant(int fd)
{
    unsigned char buf[GS_MAX_MSG_SIZE];
    for (;;) {
        int t = read_msg(fd, buf);
        if (t < 0) {
            fprintf(stderr, "connection lost\n");
            exit(2);
        }
        if (t == GS_MSG_GRANT) {
            struct gs_grant g;
            memcpy(&g, buf, sizeof(g));
            return g.epoch;
        }
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: proto_peer SOCKET hold MS | handoff N | waitgrant\n");
        return 2;
    }
    const char *path = argv[1];
    if (strcmp(argv[2], "hold") == 0 && argc > 3) {
        int fd = dial(path);
        send_acquire(fd);
        wait_grant(fd);
        printf("granted\n");
        fflush(stdout);
        uint64_t end = now_ns() + (uint64_t)atol(argv[3]) * 1000000ull;
        unsigned char buf[GS_MAX_MSG_SIZE];
        while (now_ns() < end) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 10) > 0) {
                int t = read_msg(fd, buf);
                if (t == GS_MSG_REVOKED) {
                    printf("revoked\n");
                    fflush(stdout);
                } else if (t < 0) {
                    break;
                }
            }
        }
        return 0;
    }
    if (strcmp(argv[2], "waitgrant") == 0) {
        int fd = dial(path);
        send_acquire(fd);
        wait_grant(fd);
        printf("grant_ns=%llu\n", (unsigned long long)now_ns());
        return 0;
    }
    if (strcmp(argv[2], "handoff") == 0 && argc > 3) {
        long n = atol(argv[3]);
        int a = dial(path), b = dial(path);
        uint64_t *lat = calloc((size_t)n, sizeof(uint64_t));
        send_acquire(a);
        uint32_t ea = wait_grant(a);
        for (long i = 0; i < n; i++) {
            send_acquire(b); /* b waits behind a */
            unsigned char buf[GS_MAX_MSG_SIZE];
            if (read_msg_skip_pace(a, buf) != GS_MSG_CONTENDED) /* a learns someone waits */
                return 2;
            uint64_t t0 = now_ns();
            send_release(a, ea);
            uint32_t eb = wait_grant(b);
            lat[i] = now_ns() - t0;
            int tmp = a;
            a = b;
            b = tmp;
            ea = eb;
        }
        qsort(lat, (size_t)n, sizeof(uint64_t), cmp_u64);
        printf("handoff release->grant over %ld hand-offs: p50=%.1fus p99=%.1fus max=%.1fus\n", n,
               lat[n / 2] / 1e3, lat[(n * 99) / 100] / 1e3, lat[n - 1] / 1e3);
        return 0;
    }
    fprintf(stderr, "unknown command\n");
    return 2;
}
