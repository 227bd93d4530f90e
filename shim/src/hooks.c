/* The exported CUDA entry points, generated from hooks.def (PROC ones live in procaddr.c). */
#include "internal.h"

#define GS_REAL_OR_FAIL(name)                                                                      \
    gs_fn_##name real = (gs_fn_##name)gs_real(GS_ID_##name);                                       \
    if (GS_UNLIKELY(real == NULL))                                                                 \
        return CUDA_ERROR_NOT_INITIALIZED;

/* Waits for the lock of the GPU `pick` chose (the current context's, or a stream's), then calls the driver. */
#define GS_BODY_GATED(name, params, args, pick)                                                    \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        pick;                                                                                      \
        int gd = gs_gate_enter(GS_ID_##name);                                                      \
        CUresult r = real args;                                                                    \
        gs_gate_leave(gd);                                                                         \
        return r;                                                                                  \
    }
#define GS_BODY_WORK(name, params, args, extra) GS_BODY_GATED(name, params, args, gs_dev_pick())
#define GS_BODY_SWORK(name, params, args, stream) GS_BODY_GATED(name, params, args, gs_dev_pick_stream(stream))

/* A copy or memset of device memory (src/dev_copy.c): in the single form the one GPU's gate, as any
 * work; in the list form the gates of the GPUs whose memory it touches, entered by `enter` (1 when the
 * work must be waited for, by `settle`, before those gates are left). */
#define GS_BODY_MEMWORK(name, params, args, enter, settle)                                         \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        if (GS_LIKELY(!gs_multi)) {                                                                \
            int gd = gs_gate_enter(GS_ID_##name);                                                  \
            CUresult r = real args;                                                                \
            gs_gate_leave(gd);                                                                     \
            return r;                                                                              \
        }                                                                                          \
        struct gs_gates gg;                                                                        \
        int settle_ = enter;                                                                       \
        CUresult r = real args;                                                                    \
        if (settle_ && r == CUDA_SUCCESS)                                                          \
            settle;                                                                                \
        gs_gates_leave(&gg);                                                                       \
        return r;                                                                                  \
    }
/* Synchronous (extra: the GPUs of its two sides): done when the driver returns. */
#define GS_BODY_COPY(name, params, args, slots) GS_BODY_COPY_(name, params, args, GS_UNPAIR slots)
#define GS_BODY_COPY_(...) GS_BODY_COPY__(__VA_ARGS__)
#define GS_BODY_COPY__(name, params, args, dst, src)                                               \
    GS_BODY_MEMWORK(name, params, args, gs_gates_enter(&gg, GS_ID_##name, (dst), (src)), (void)0)
/* On a stream (extra: the stream, the GPUs of its two sides): the stream's GPU's gate too; work on
 * another GPU's memory is complete before the gates are left. */
#define GS_BODY_SCOPY(name, params, args, sds) GS_BODY_SCOPY_(name, params, args, GS_UNTRIPLE sds)
#define GS_UNTRIPLE(s, dst, src) s, dst, src
#define GS_BODY_SCOPY_(...) GS_BODY_SCOPY__(__VA_ARGS__)
#define GS_BODY_SCOPY__(name, params, args, stream, dst, src)                                      \
    GS_BODY_MEMWORK(name, params, args, gs_gates_enter_stream(&gg, GS_ID_##name, (stream), (dst), (src)), \
                    gs_gates_settle(stream))

/* A launch: with a launch bound, waits (outside the gate) while the process's queue is full, and marks
 * the queue after the launch (in flight, so a release's drain sees the mark); with release on completion
 * (settle.c) notes its stream, in flight too. Neither: two loads and branches more. */
#define GS_BODY_LAUNCH(name, params, args, stream_key) GS_BODY_LAUNCH_(name, params, args, GS_UNPAIR stream_key)
#define GS_UNPAIR(stream, key) stream, key
#define GS_BODY_LAUNCH_(...) GS_BODY_LAUNCH__(__VA_ARGS__)
#define GS_BODY_LAUNCH__(name, params, args, stream, key)                                          \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_dev_pick_stream(stream);                                                                \
        struct gs_pace_ticket pt;                                                                  \
        int paced = GS_UNLIKELY(atomic_load_explicit(&gs_pace_max[gs_dev_cur], memory_order_relaxed) != 0) && \
                    gs_pace_before(&pt, (key), (stream));                                         \
        int gd = gs_gate_enter(GS_ID_##name);                                                      \
        CUresult r = real args;                                                                    \
        if (GS_UNLIKELY(paced))                                                                    \
            gs_pace_after(&pt, r == CUDA_SUCCESS ? (stream) : NULL, r);                            \
        if (GS_UNLIKELY(atomic_load_explicit(&gs_settle_on[gs_dev_cur], memory_order_relaxed)) && \
            r == CUDA_SUCCESS)                                                                     \
            gs_settle_note(stream);                                                                \
        gs_gate_leave(gd);                                                                         \
        return r;                                                                                  \
    }

#define GS_BODY_CAPBEGIN(name, params, args, stream)                                               \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_dev_pick_stream(stream);                                                                \
        int gd = gs_gate_enter(GS_ID_##name);                                                      \
        gs_capture_begin();                                                                        \
        CUresult r = real args;                                                                    \
        gs_capture_begun(stream, r);                                                               \
        gs_gate_leave(gd);                                                                         \
        return r;                                                                                  \
    }

#define GS_BODY_CAPEND(name, params, args, stream)                                                 \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        CUresult r = real args;                                                                    \
        gs_capture_remove(stream);                                                                 \
        return r;                                                                                  \
    }

/* Every CTXNEW entry point names its device's ordinal dev. */
#define GS_BODY_CTXNEW(name, params, args, pctx)                                                   \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_dev_pick_ordinal(dev);                                                                  \
        if (GS_UNLIKELY(gs_cap_ctx_admit() != CUDA_SUCCESS))                                       \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                       \
        CUresult r = real args;                                                                    \
        if (r == CUDA_SUCCESS && (pctx) != NULL) {                                                 \
            gs_dev_ctx_seen(*(pctx), dev);                                                         \
            gs_ctx_add(*(pctx));                                                                   \
            gs_cap_ctx_made();                                                                     \
        }                                                                                          \
        return r;                                                                                  \
    }

#define GS_BODY_CTXGONE(name, params, args, ctx)                                                   \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_ctx_remove(ctx);                                                                        \
        gs_pace_forget_ctx(ctx);                                                                   \
        gs_settle_forget_ctx(ctx);                                                                 \
        return real args;                                                                          \
    }

#define GS_BODY_DEVGONE(name, params, args, dev)                                                   \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_pace_forget_dev(dev);                                                                   \
        gs_settle_forget_ctx(NULL);                                                                \
        return real args;                                                                          \
    }

#define GS_BODY_MM(name, params, args, extra)
#define GS_BODY_PROC(name, params, args, extra)
#define GS_BODY_USE(name, params, args, extra)

#define GS_HOOK(cls, name, params, args, extra) GS_BODY_##cls(name, params, args, extra)
#include "hooks.def"
#undef GS_HOOK
