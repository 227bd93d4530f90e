/*
 * Which GPUs' gates a copy or memset passes in the list form of several GPUs (docs/multigpu.md).
 *
 * A swappable allocation is resident only while its GPU's gate is open with a call in flight there: its
 * GPU's background thread swaps it out only after a release, once no call is in flight. So a copy of GPU
 * B's swappable memory must be in flight on B's gate, whichever context is current or whichever stream
 * runs it, and a copy between two GPUs' memory on both gates. The memory manager's table knows each
 * swappable allocation's GPU; any other pointer (host memory, plain allocations, memory of a GPU not
 * shared) counts as the call's default GPU, as before: the current context's, or the stream's.
 *
 * The gates are passed in slot order, each as a single gate is (gs_gate_wait: bounded by
 * GPUSHARE_WAIT_TIMEOUT_MS per gate), so two threads copying 0->1 and 1->0 wait in the same order. A
 * thread waiting for its second gate is in flight on its first: that GPU's lock stays with the process
 * (its scheduler revokes it past quantum + grace, as it would any long call) and its memory stays
 * resident; gangs (docs/qos.md#gangs) grant a pod's locks together, so the wait is normally none.
 *
 * Work on a stream of GPU A that touches GPU B's swappable memory runs after the call returns, when B's
 * gate may have been left: B's release synchronizes only B's contexts. Such a call waits for its stream
 * before it leaves the gates (gs_gates_settle).
 */
#include "internal.h"

int gs_dev_of_mem(CUdeviceptr p)
{
    struct gs_mm_info in;
    if (p == 0)
        return GS_DEV_CUR;
    if (gs_mm_lookup(p, &in))
        return in.slot;
    int d = gs_mm_va_slot(p); /* the application's own swappable cuMemCreate handles */
    return d != GS_DEV_NONE ? d : GS_DEV_CUR;
}

int gs_dev_of_peer(CUdeviceptr p, CUcontext ctx)
{
    int d = gs_dev_of_mem(p);
    return d == GS_DEV_CUR && ctx != NULL ? gs_dev_slot_of_ctx(ctx) : d;
}

/* One side of a 2D/3D copy: its device pointer's GPU; an array's is the default GPU; host memory none. */
static int side(int type, CUdeviceptr p, CUcontext ctx)
{
    if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED)
        return gs_dev_of_peer(p, ctx);
    if (type == CU_MEMORYTYPE_ARRAY)
        return ctx != NULL ? gs_dev_slot_of_ctx(ctx) : GS_DEV_CUR;
    return GS_DEV_NOMEM;
}

int gs_dev_of_m2d(const CUDA_MEMCPY2D *m, int dst)
{
    if (m == NULL)
        return GS_DEV_CUR;
    return dst ? side(m->dstMemoryType, m->dstDevice, NULL) : side(m->srcMemoryType, m->srcDevice, NULL);
}

int gs_dev_of_m3d(const CUDA_MEMCPY3D *m, int dst)
{
    if (m == NULL)
        return GS_DEV_CUR;
    return dst ? side(m->dstMemoryType, m->dstDevice, NULL) : side(m->srcMemoryType, m->srcDevice, NULL);
}

int gs_dev_of_m3dpeer(const CUDA_MEMCPY3D_PEER *m, int dst)
{
    if (m == NULL)
        return GS_DEV_CUR;
    return dst ? side(m->dstMemoryType, m->dstDevice, m->dstContext)
               : side(m->srcMemoryType, m->srcDevice, m->srcContext);
}

/* Adds shared GPU d to the set, kept in slot order. */
static void add(struct gs_gates *g, int d)
{
    if (d < 0 || d >= GS_DEV_NONE)
        return;
    int i = 0;
    while (i < g->n && g->d[i] < d)
        i++;
    if (i < g->n && g->d[i] == d)
        return;
    for (int k = g->n; k > i; k--)
        g->d[k] = g->d[k - 1];
    g->d[i] = d;
    g->n++;
}

/* Passes every gate of the set in slot order; the calling thread's GPU is then the default one. */
static void pass(struct gs_gates *g, int id, int dflt)
{
    if (GS_UNLIKELY(atomic_load_explicit(&gs_count_calls, memory_order_relaxed)))
        atomic_fetch_add_explicit(&gs_calls[id], 1, memory_order_relaxed);
    for (int i = 0; i < g->n; i++) {
        gs_dev_cur = g->d[i];
        gs_gate_pass(g->d[i]);
    }
    gs_dev_cur = dflt;
}

int gs_gates_enter(struct gs_gates *g, int id, int a, int b)
{
    g->n = 0;
    int dflt = GS_DEV_NONE;
    if (a == GS_DEV_CUR || b == GS_DEV_CUR || (a == GS_DEV_NOMEM && b == GS_DEV_NOMEM))
        add(g, dflt = gs_dev_pick_ctx_slow(NULL));
    add(g, a);
    add(g, b);
    pass(g, id, dflt);
    return 0;
}

int gs_gates_enter_stream(struct gs_gates *g, int id, CUstream s, int a, int b)
{
    g->n = 0;
    int sd = gs_dev_pick_stream_slow(s);
    add(g, sd);
    add(g, a);
    add(g, b);
    pass(g, id, sd);
    int foreign = 0;
    for (int i = 0; i < g->n; i++)
        foreign |= g->d[i] != sd;
    return foreign;
}

void gs_gates_settle(CUstream s)
{
    if (gs_capturing())
        return; /* a capturing stream records the work; synchronizing would invalidate the capture */
    gs_fn_cuStreamSynchronize sync = (gs_fn_cuStreamSynchronize)gs_real(GS_ID_cuStreamSynchronize);
    if (sync != NULL)
        sync(s); /* the work's own error is the application's to see at its next synchronization */
}

void gs_gates_leave(const struct gs_gates *g)
{
    for (int i = 0; i < g->n; i++)
        gs_gate_leave(g->d[i]);
}
