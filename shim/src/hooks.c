/* The exported CUDA entry points, generated from hooks.def (PROC ones live in procaddr.c). */
#include "internal.h"

#define GS_REAL_OR_FAIL(name)                                                                      \
    gs_fn_##name real = (gs_fn_##name)gs_real(GS_ID_##name);                                       \
    if (GS_UNLIKELY(real == NULL))                                                                 \
        return CUDA_ERROR_NOT_INITIALIZED;

#define GS_BODY_WORK(name, params, args, extra)                                                    \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_gate_enter(GS_ID_##name);                                                               \
        CUresult r = real args;                                                                    \
        gs_gate_leave();                                                                           \
        return r;                                                                                  \
    }

#define GS_BODY_CAPBEGIN(name, params, args, stream)                                               \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_gate_enter(GS_ID_##name);                                                               \
        gs_capture_begin();                                                                        \
        CUresult r = real args;                                                                    \
        gs_capture_begun(stream, r);                                                               \
        gs_gate_leave();                                                                           \
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

#define GS_BODY_CTXNEW(name, params, args, pctx)                                                   \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        CUresult r = real args;                                                                    \
        if (r == CUDA_SUCCESS && (pctx) != NULL)                                                   \
            gs_ctx_add(*(pctx));                                                                   \
        return r;                                                                                  \
    }

#define GS_BODY_CTXGONE(name, params, args, ctx)                                                   \
    GS_EXPORT CUresult name params;                                                                \
    GS_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        GS_REAL_OR_FAIL(name)                                                                      \
        gs_ctx_remove(ctx);                                                                        \
        return real args;                                                                          \
    }

#define GS_BODY_MM(name, params, args, extra)
#define GS_BODY_PROC(name, params, args, extra)
#define GS_BODY_USE(name, params, args, extra)

#define GS_HOOK(cls, name, params, args, extra) GS_BODY_##cls(name, params, args, extra)
#include "hooks.def"
#undef GS_HOOK
