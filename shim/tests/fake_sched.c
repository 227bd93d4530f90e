/*
 * A scripted GPU scheduler for the shim's oversubscription tests: one client at a time, every
 * answer decided by its options and by files the test creates, so a test drives each state it
 * checks (a reply held back, an eviction requested) instead of waiting for the real scheduler's
 * timing.
 *   fake_sched SOCKET key=value ...
 *     budget=BYTES         WELCOME's budget (default 1 GiB), mode Auto, quantum 60 s
 *     stall_above=BYTES    a MEMREQ for more than this is answered only once release_file exists;
 *                          memreq_file is created when such a MEMREQ arrives
 *     memreq_file=PATH release_file=PATH
 *     evict_on_release=1   after each RELEASE: EVICT down to 0 (the next grant swaps everything in)
 *     revoke_file=PATH     once PATH exists (once): REVOKED for the holder's epoch, then EVICT to 0
 *     version=V            the newest protocol version it speaks (default GS_PROTO_VERSION): a HELLO of
 *                          a later version is refused by closing the connection, as the scheduler of
 *                          that version does; a client is answered in its own version, and one whose
 *                          frames change version is dropped
 *     pace=N               PACE N right after WELCOME, to clients of version 4 and later
 *     pace_any=1           ... and to older clients too (a scheduler that breaks the protocol)
 *     pace_file=PATH pace_next=M   once PATH exists (once): PACE M
 *     idle=N               IDLE idle_us=N right after WELCOME (after PACE), to clients of version 5 and later
 *     idle_any=1           ... and to older clients too (a scheduler that breaks the protocol)
 *     settle=N             SETTLE floor_us=N right after WELCOME (after IDLE), to clients of version 7 and later
 *     pace_time=N          PACE_TIME queue_us=N right after WELCOME (before PACE), to clients of version 7 and later
 *     claim=BYTES          (version 6) the client is in a claim's ledger of BYTES (LEDGER flags ON right
 *                          after WELCOME; without it, LEDGER flags 0), with reserve=BYTES per process
 *                          (default 256 MiB), chunk=BYTES (default 64 MiB), and others=BYTES granted to
 *                          procs=N-1 other processes (default none); CHARGE is answered as the agent's
 *                          scheduler does (at least a chunk, within claim - procs*reserve)
 *     refused=1            with claim: LEDGER flags REFUSED (no room for the client's context) instead of ON
 *     stall_charge=1       never answer a CHARGE (the client must give up in its own time)
 *     policy=F             POLICY flags=F right after WELCOME's LEDGER (before PACE), to clients of version 6 and
 *                          later (default 1: the environment may loosen pacing and waits; -1: no POLICY)
 *     grant=0              never answer an ACQUIRE (production keeps the GPU without a gap)
 *     grant_file=PATH      an ACQUIRE after the first GRANT is answered only once PATH exists ("got
 *                          ACQUIRE need=N; holding the GRANT back" meanwhile)
 *     pong=0               never answer a PING (a scheduler that no longer serves the queue)
 *     welcome_delay_ms=N   answer a HELLO N ms late (a scheduler whose pod lookups are slow)
 *     drop_hellos=N        close the first N connections at their HELLO, whatever its version, as a
 *                          scheduler that is shutting down closes what it accepted ("dropped HELLO version=V")
 * Every message it gets or sends is a line on stdout: "got ACQUIRE need=N", "sent EVICT", "got USAGE
 * reason=R resident=N swapped=N", ...
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpushare_proto.h"

static const char *arg(int argc, char **argv, const char *key, const char *def)
{
    size_t k = strlen(key);
    for (int i = 2; i < argc; i++)
        if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=')
            return argv[i] + k + 1;
    return def;
}

static int exists(const char *p)
{
    return p != NULL && *p != '\0' && access(p, F_OK) == 0;
}

static uint16_t client_version; /* the connected client's HELLO version: every answer carries it */

static void hdr(void *msg, uint16_t type, uint32_t size)
{
    struct gs_header h = {.magic = GS_PROTO_MAGIC, .version = client_version, .type = type, .size = size};
    memcpy(msg, &h, sizeof(h));
}

static void say(const char *fmt, unsigned long long a, unsigned long long b, unsigned long long c)
{
    printf(fmt, a, b, c);
    fflush(stdout);
}

static void send_msg(int fd, void *m, uint16_t type, uint32_t size)
{
    hdr(m, type, size);
    if (send(fd, m, size, MSG_NOSIGNAL) != (ssize_t)size)
        fprintf(stderr, "fake_sched: send failed: %s\n", strerror(errno));
}

/* PACE, IDLE, PONG or POLICY: a header and one 32-bit value, laid out alike. */
_Static_assert(sizeof(struct gs_pace) == sizeof(struct gs_idle) &&
                   offsetof(struct gs_pace, max_queued) == offsetof(struct gs_idle, idle_us) &&
                   sizeof(struct gs_pace) == sizeof(struct gs_ping) && sizeof(struct gs_pace) == sizeof(struct gs_policy),
               "PACE, IDLE, PONG and POLICY share a layout");
static void send_value(int fd, uint16_t type, uint32_t v, const char *said)
{
    struct gs_pace m;
    memset(&m, 0, sizeof(m));
    m.max_queued = v;
    send_msg(fd, &m, type, GS_PACE_SIZE);
    say(said, v, 0, 0);
}

/* GRANT of the next epoch, reserving need (at least what was reserved); the new epoch. */
static uint32_t send_grant(int fd, uint32_t epoch, uint64_t need, uint64_t *reserved)
{
    struct gs_grant g;
    memset(&g, 0, sizeof(g));
    g.epoch = epoch + 1;
    g.quantum_ms = 60000;
    *reserved = need > *reserved ? need : *reserved;
    g.resident = *reserved;
    send_msg(fd, &g, GS_MSG_GRANT, GS_GRANT_SIZE);
    return g.epoch;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fake_sched SOCKET key=value...\n");
        return 2;
    }
    uint64_t budget = strtoull(arg(argc, argv, "budget", "1073741824"), NULL, 10);
    unsigned long welcome_delay_ms = strtoul(arg(argc, argv, "welcome_delay_ms", "0"), NULL, 10);
    uint64_t stall_above = strtoull(arg(argc, argv, "stall_above", "18446744073709551615"), NULL, 10);
    const char *memreq_file = arg(argc, argv, "memreq_file", NULL);
    const char *release_file = arg(argc, argv, "release_file", NULL);
    const char *revoke_file = arg(argc, argv, "revoke_file", NULL);
    int evict_on_release = atoi(arg(argc, argv, "evict_on_release", "0"));
    unsigned long speaks = strtoul(arg(argc, argv, "version", "0"), NULL, 10);
    unsigned long drop_hellos = strtoul(arg(argc, argv, "drop_hellos", "0"), NULL, 10);
    if (speaks == 0)
        speaks = GS_PROTO_VERSION;
    const char *pace = arg(argc, argv, "pace", NULL);
    int pace_any = atoi(arg(argc, argv, "pace_any", "0"));
    const char *pace_file = arg(argc, argv, "pace_file", NULL);
    uint32_t pace_next = (uint32_t)strtoul(arg(argc, argv, "pace_next", "0"), NULL, 10);
    int paced_next = 0;
    const char *idle = arg(argc, argv, "idle", NULL);
    const char *settle = arg(argc, argv, "settle", NULL);
    const char *pace_time = arg(argc, argv, "pace_time", NULL);
    int idle_any = atoi(arg(argc, argv, "idle_any", "0"));
    uint64_t claim = strtoull(arg(argc, argv, "claim", "0"), NULL, 10);
    uint64_t reserve = strtoull(arg(argc, argv, "reserve", "268435456"), NULL, 10);
    uint64_t chunk = strtoull(arg(argc, argv, "chunk", "67108864"), NULL, 10);
    uint64_t others = strtoull(arg(argc, argv, "others", "0"), NULL, 10);
    uint64_t procs = strtoull(arg(argc, argv, "procs", "1"), NULL, 10);
    int stall_charge = atoi(arg(argc, argv, "stall_charge", "0"));
    int refused = atoi(arg(argc, argv, "refused", "0"));
    uint64_t grant = 0, ledger_total = claim > procs * reserve ? claim - procs * reserve : 0;
    int policy = atoi(arg(argc, argv, "policy", "1"));
    int answer_acquire = atoi(arg(argc, argv, "grant", "1"));
    int pong = atoi(arg(argc, argv, "pong", "1"));
    const char *grant_file = arg(argc, argv, "grant_file", NULL);

    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, argv[1], sizeof(a.sun_path) - 1);
    unlink(argv[1]);
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 4) != 0) {
        perror("fake_sched: bind");
        return 2;
    }
    say("listening\n", 0, 0, 0);
    int fd = -1, held = 0, revoked = 0;
    uint32_t epoch = 0;
    uint64_t stalled = 0, reserved = 0; /* stalled: the need of a MEMREQ not answered yet */
    uint64_t held_back = 0;              /* an ACQUIRE's need + 1 while grant_file holds its GRANT back */
    unsigned char buf[4096];
    size_t have = 0;
    for (;;) {
        struct pollfd p = {.fd = fd >= 0 ? fd : ls, .events = POLLIN};
        int r = poll(&p, 1, 5);
        if (fd >= 0 && held_back != 0 && exists(grant_file)) {
            epoch = send_grant(fd, epoch, held_back - 1, &reserved);
            held = 1;
            say("sent the GRANT held back: need=%llu epoch=%llu\n", held_back - 1, epoch, 0);
            held_back = 0;
        }
        if (r > 0 && fd < 0) {
            fd = accept(ls, NULL, NULL);
            have = 0;
            continue;
        }
        if (r > 0) {
            ssize_t n = recv(fd, buf + have, sizeof(buf) - have, 0);
            if (n <= 0) {
                say("client gone\n", 0, 0, 0);
                close(fd);
                fd = -1;
                held = 0;
                held_back = 0;
                continue;
            }
            have += (size_t)n;
        }
        while (fd >= 0 && have >= GS_HEADER_SIZE) {
            struct gs_header h;
            memcpy(&h, buf, sizeof(h));
            if (h.magic != GS_PROTO_MAGIC || h.size < GS_HEADER_SIZE || h.size > GS_MAX_MSG_SIZE) {
                fprintf(stderr, "fake_sched: bad message\n");
                return 1;
            }
            if (have < h.size)
                break;
            unsigned char m[GS_MAX_MSG_SIZE];
            memcpy(m, buf, h.size);
            memmove(buf, buf + h.size, have - h.size);
            have -= h.size;
            if (h.type == GS_MSG_HELLO) {
                say("got HELLO version=%llu\n", h.version, 0, 0);
                if (drop_hellos > 0) {
                    drop_hellos--;
                    say("dropped HELLO version=%llu\n", h.version, 0, 0);
                    close(fd);
                    fd = -1;
                    break;
                }
                if (h.version > speaks || h.version < GS_PROTO_MIN_VERSION) {
                    say("refused HELLO version=%llu\n", h.version, 0, 0);
                    close(fd);
                    fd = -1;
                    break;
                }
                client_version = h.version;
            } else if (h.version != client_version) {
                say("client changed protocol version to %llu; dropped\n", h.version, 0, 0);
                close(fd);
                fd = -1;
                held = 0;
                break;
            }
            if (h.type == GS_MSG_HELLO) {
                if (welcome_delay_ms > 0)
                    usleep((useconds_t)(welcome_delay_ms * 1000));
                struct gs_welcome w;
                memset(&w, 0, sizeof(w));
                w.client_id = 1;
                w.quantum_ms = 60000;
                w.grace_ms = 60000;
                w.mode = GS_MODE_AUTO;
                w.budget = budget;
                send_msg(fd, &w, GS_MSG_WELCOME, GS_WELCOME_SIZE);
                if (client_version >= 6) {
                    struct gs_ledger l;
                    memset(&l, 0, sizeof(l));
                    grant = 0;
                    if (claim > 0) {
                        l.flags = refused ? GS_LEDGER_REFUSED : GS_LEDGER_ON;
                        l.processes = (uint32_t)procs;
                        l.claim = claim;
                        l.reserve = reserve;
                        l.total = ledger_total;
                        l.granted = others;
                        l.chunk = chunk;
                    }
                    send_msg(fd, &l, GS_MSG_LEDGER, GS_LEDGER_SIZE);
                    say("sent LEDGER total=%llu\n", l.total, 0, 0);
                }
                if (policy >= 0 && client_version >= 6)
                    send_value(fd, GS_MSG_POLICY, (uint32_t)policy, "sent POLICY flags=%llu\n");
                if (pace_time != NULL && client_version >= 7)
                    send_value(fd, GS_MSG_PACE_TIME, (uint32_t)strtoul(pace_time, NULL, 10),
                               "sent PACE_TIME queue_us=%llu\n");
                if (pace != NULL && (client_version >= 4 || pace_any))
                    send_value(fd, GS_MSG_PACE, (uint32_t)strtoul(pace, NULL, 10), "sent PACE max_queued=%llu\n");
                if (idle != NULL && (client_version >= 5 || idle_any))
                    send_value(fd, GS_MSG_IDLE, (uint32_t)strtoul(idle, NULL, 10), "sent IDLE idle_us=%llu\n");
                if (settle != NULL && client_version >= 7)
                    send_value(fd, GS_MSG_SETTLE, (uint32_t)strtoul(settle, NULL, 10), "sent SETTLE floor_us=%llu\n");
            } else if (h.type == GS_MSG_PING) {
                struct gs_ping q;
                memcpy(&q, m, sizeof(q));
                say("got PING seq=%llu\n", q.seq, 0, 0);
                if (pong)
                    send_value(fd, GS_MSG_PONG, q.seq, "sent PONG seq=%llu\n");
            } else if (h.type == GS_MSG_PACING) {
                struct gs_pacing q;
                memcpy(&q, m, sizeof(q));
                say("got PACING max_queued=%llu state=%llu\n", q.max_queued, q.state, 0);
            } else if (h.type == GS_MSG_ACQUIRE && !answer_acquire) {
                say("got ACQUIRE; not granting\n", 0, 0, 0);
            } else if (h.type == GS_MSG_ACQUIRE) {
                struct gs_acquire q;
                memcpy(&q, m, sizeof(q));
                if (grant_file != NULL && epoch > 0 && !exists(grant_file)) {
                    held_back = q.need + 1;
                    say("got ACQUIRE need=%llu; holding the GRANT back\n", q.need, 0, 0);
                    continue;
                }
                epoch = send_grant(fd, epoch, q.need, &reserved);
                held = 1;
                say("got ACQUIRE need=%llu; sent GRANT epoch=%llu\n", q.need, epoch, 0);
            } else if (h.type == GS_MSG_RELEASE) {
                held = 0;
                say("got RELEASE\n", 0, 0, 0);
                if (evict_on_release) {
                    struct gs_evict e;
                    memset(&e, 0, sizeof(e));
                    send_msg(fd, &e, GS_MSG_EVICT, GS_EVICT_SIZE);
                    say("sent EVICT\n", 0, 0, 0);
                }
            } else if (h.type == GS_MSG_MEMREQ) {
                struct gs_memreq q;
                memcpy(&q, m, sizeof(q));
                say("got MEMREQ need=%llu\n", q.need, 0, 0);
                if (q.need > stall_above && !exists(release_file)) {
                    stalled = q.need;
                    if (memreq_file != NULL) {
                        FILE *f = fopen(memreq_file, "w");
                        if (f != NULL)
                            fclose(f);
                    }
                    say("holding the MEMREPLY back\n", 0, 0, 0);
                    continue;
                }
                struct gs_memreply rep;
                memset(&rep, 0, sizeof(rep));
                rep.status = q.need <= budget ? GS_MEM_OK : GS_MEM_TOO_LARGE;
                reserved = q.need <= budget ? q.need : reserved;
                rep.resident = reserved;
                send_msg(fd, &rep, GS_MSG_MEMREPLY, GS_MEMREPLY_SIZE);
            } else if (h.type == GS_MSG_CHARGE) {
                struct gs_charge q;
                memcpy(&q, m, sizeof(q));
                if (stall_charge) {
                    say("got CHARGE bytes=%llu; holding the CHARGED back\n", q.bytes, 0, 0);
                    continue;
                }
                uint64_t left = ledger_total > others + grant ? ledger_total - others - grant : 0;
                struct gs_charged c;
                memset(&c, 0, sizeof(c));
                c.seq = q.seq;
                c.status = claim > 0 && q.bytes > 0 && q.bytes <= left ? GS_CHARGE_OK : GS_CHARGE_REFUSED;
                if (c.status == GS_CHARGE_OK)
                    c.added = q.bytes > chunk ? (q.bytes < left ? q.bytes : left) : (chunk < left ? chunk : left);
                grant += c.added;
                c.grant = grant;
                c.total = ledger_total;
                c.granted = others + grant;
                send_msg(fd, &c, GS_MSG_CHARGED, GS_CHARGED_SIZE);
                say("got CHARGE bytes=%llu; sent CHARGED added=%llu grant=%llu\n", q.bytes, c.added, grant);
            } else if (h.type == GS_MSG_RETURN) {
                struct gs_return q;
                memcpy(&q, m, sizeof(q));
                if (q.flags & GS_RETURN_HOLD)
                    grant = q.bytes;
                else
                    grant -= q.bytes < grant ? q.bytes : grant;
                say("got RETURN flags=%llu bytes=%llu grant=%llu\n", q.flags, q.bytes, grant);
            } else if (h.type == GS_MSG_REJOIN) {
                say("got REJOIN\n", 0, 0, 0);
            } else if (h.type == GS_MSG_USAGE) {
                struct gs_usage u;
                memcpy(&u, m, sizeof(u));
                if (u.resident < reserved && u.reason != GS_USAGE_REPORT)
                    reserved = u.resident;
                say("got USAGE reason=%llu resident=%llu swapped=%llu\n", u.reason, u.resident, u.swapped);
            }
        }
        if (fd >= 0 && stalled > 0 && exists(release_file)) {
            struct gs_memreply rep;
            memset(&rep, 0, sizeof(rep));
            rep.status = GS_MEM_OK;
            reserved = stalled;
            rep.resident = reserved;
            stalled = 0;
            send_msg(fd, &rep, GS_MSG_MEMREPLY, GS_MEMREPLY_SIZE);
            say("sent the MEMREPLY held back\n", 0, 0, 0);
        }
        if (fd >= 0 && client_version >= 4 && !paced_next && exists(pace_file)) {
            paced_next = 1;
            send_value(fd, GS_MSG_PACE, pace_next, "sent PACE max_queued=%llu\n");
        }
        if (fd >= 0 && held && !revoked && exists(revoke_file)) {
            revoked = 1;
            held = 0;
            struct gs_revoked v;
            memset(&v, 0, sizeof(v));
            v.epoch = epoch;
            send_msg(fd, &v, GS_MSG_REVOKED, GS_REVOKED_SIZE);
            struct gs_evict e;
            memset(&e, 0, sizeof(e));
            send_msg(fd, &e, GS_MSG_EVICT, GS_EVICT_SIZE);
            say("sent REVOKED epoch=%llu and EVICT\n", epoch, 0, 0);
        }
    }
}
