/*
 * Wire protocol between the shim (one connection per process) and the
 * per-GPU scheduler (agent/scheduler). The Go side mirrors these numbers in
 * agent/scheduler/proto.go and a test parses this file to keep them equal.
 *
 * Every message starts with gs_header {magic, version, type, size}; size is
 * the whole message in bytes including the header and is fixed per type.
 * All integers are little-endian. A peer that sends a bad magic, version,
 * size or type is disconnected; the shim then runs in pass-through.
 *
 * The lease is the connection: the scheduler frees the lock the moment a
 * holder's socket closes, so a killed process never leaks it.
 */
#ifndef GPUSHARE_PROTO_H
#define GPUSHARE_PROTO_H

#include <stdint.h>

#define GS_PROTO_MAGIC 0x48535047u /* bytes "GPSH" */
#define GS_PROTO_VERSION 1u
#define GS_MAX_MSG_SIZE 256u
#define GS_UUID_LEN 64u

/* Message types. c->s: client to scheduler, s->c: scheduler to client. */
#define GS_MSG_HELLO 1u     /* c->s first message: pid, priority, GPU uuid */
#define GS_MSG_WELCOME 2u   /* s->c answer to HELLO: client id, quantum, grace */
#define GS_MSG_ACQUIRE 3u   /* c->s: wants the GPU */
#define GS_MSG_GRANT 4u     /* s->c: the GPU is yours for epoch, quantum */
#define GS_MSG_RELEASE 5u   /* c->s: done with epoch, GPU work drained */
#define GS_MSG_CONTENDED 6u /* s->c: someone waits; release once quantum is used */
#define GS_MSG_REVOKED 7u   /* s->c: held past quantum + grace; epoch is void */

#define GS_PRIORITY_NORMAL 0u
#define GS_PRIORITY_HIGH 1u

/* Fixed message sizes in bytes, header included. */
#define GS_HEADER_SIZE 12u
#define GS_HELLO_SIZE 84u
#define GS_WELCOME_SIZE 24u
#define GS_ACQUIRE_SIZE 12u
#define GS_GRANT_SIZE 20u
#define GS_RELEASE_SIZE 16u
#define GS_CONTENDED_SIZE 20u
#define GS_REVOKED_SIZE 16u

struct gs_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t size;
};

struct gs_hello {
    struct gs_header h;
    uint32_t pid;
    uint32_t priority;
    char gpu_uuid[GS_UUID_LEN]; /* NUL-padded; empty = whatever GPU this socket serves */
};

struct gs_welcome {
    struct gs_header h;
    uint32_t client_id;
    uint32_t quantum_ms;
    uint32_t grace_ms;
};

struct gs_acquire {
    struct gs_header h;
};

struct gs_grant {
    struct gs_header h;
    uint32_t epoch;
    uint32_t quantum_ms;
};

struct gs_release {
    struct gs_header h;
    uint32_t epoch;
};

struct gs_contended {
    struct gs_header h;
    uint32_t epoch;
    uint32_t waiters;
};

struct gs_revoked {
    struct gs_header h;
    uint32_t epoch;
};

#ifndef __cplusplus
_Static_assert(sizeof(struct gs_header) == GS_HEADER_SIZE, "header size");
_Static_assert(sizeof(struct gs_hello) == GS_HELLO_SIZE, "hello size");
_Static_assert(sizeof(struct gs_welcome) == GS_WELCOME_SIZE, "welcome size");
_Static_assert(sizeof(struct gs_acquire) == GS_ACQUIRE_SIZE, "acquire size");
_Static_assert(sizeof(struct gs_grant) == GS_GRANT_SIZE, "grant size");
_Static_assert(sizeof(struct gs_release) == GS_RELEASE_SIZE, "release size");
_Static_assert(sizeof(struct gs_contended) == GS_CONTENDED_SIZE, "contended size");
_Static_assert(sizeof(struct gs_revoked) == GS_REVOKED_SIZE, "revoked size");
#endif

#endif
