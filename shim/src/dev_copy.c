/*
 * Which GPUs' gates a copy or memset passes in the list form of several GPUs (docs/multigpu.md).
 *
 * A swappable allocation is resident only while its GPU's gate is open with a call in flight there: its
 * GPU's background thread swaps it out only after a release, once no call is in flight. So a copy of GPU
 * B's swappable memory must be in flight on B's gate, whichever context is current or whichever stream
 * runs it, and a copy between two GPUs' memory on both gates. The memory manager's table knows each
 * swappable allocation's GPU. For other device memory of GPU B (a plain allocation) a synchronous call
 * asks the driver and passes B's gate too: such a call is serialized with work in the contexts of
 * both sides, so it must not run while another process holds B's lock. A call on a stream does not ask:
 * its stream's GPU runs the work, and taking B's gate would make it wait for its stream (below) for no
 * memory to protect. Host memory, managed memory (it migrates) and memory of a GPU not shared count as
 * the call's default GPU: the current context's, or the stream's.
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

/* The GPU the driver says holds device memory p, or GS_DEV_CUR. One driver call, made only for
 * pointers the shim's tables do not know, in the list form. */
static int driver_slot(CUdeviceptr p)
{
    gs_fn_cuPointerGetAttributes get = (gs_fn_cuPointerGetAttributes)gs_real(GS_ID_cuPointerGetAttributes);
    if (get == NULL)
        return GS_DEV_CUR;
    unsigned int type = 0, managed = 0;
    int ord = -1;
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[3] = {&type, &managed, &ord};
    /* An unknown pointer is no error for this call: its attributes stay zero, which reads as host memory. */
    if (get(3, attrs, data, p) != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE || managed != 0)
        return GS_DEV_CUR;
    int d = gs_dev_slot_of_ordinal(ord);
    return d != GS_DEV_NONE ? d : GS_DEV_CUR;
}

int gs_dev_of_mem(CUdeviceptr p, int ask)
{
    struct gs_mm_info in;
    if (p == 0)
        return GS_DEV_CUR;
    if (gs_mm_lookup(p, &in))
        return in.slot;
    int d = gs_mm_va_slot(p); /* the application's own swappable cuMemCreate handles */
    if (d != GS_DEV_NONE)
        return d;
    return ask ? driver_slot(p) : GS_DEV_CUR;
}

int gs_dev_of_peer(CUdeviceptr p, CUcontext ctx)
{
    int d = gs_dev_of_mem(p, 0);
    return d == GS_DEV_CUR && ctx != NULL ? gs_dev_slot_of_ctx(ctx) : d;
}

/* One side of a 2D/3D copy: its device pointer's GPU (ask: as gs_dev_of_mem); an array's is the
 * default GPU; host memory none. */
static int side(int type, CUdeviceptr p, CUcontext ctx, int ask)
{
    if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED)
        return ctx != NULL ? gs_dev_of_peer(p, ctx) : gs_dev_of_mem(p, ask);
    if (type == CU_MEMORYTYPE_ARRAY)
        return ctx != NULL ? gs_dev_slot_of_ctx(ctx) : GS_DEV_CUR;
    return GS_DEV_NOMEM;
}

int gs_dev_of_m2d(const CUDA_MEMCPY2D *m, int dst, int ask)
{
    if (m == NULL)
        return GS_DEV_CUR;
    return dst ? side(m->dstMemoryType, m->dstDevice, NULL, ask) : side(m->srcMemoryType, m->srcDevice, NULL, ask);
}

int gs_dev_of_m3d(const CUDA_MEMCPY3D *m, int dst, int ask)
{
    if (m == NULL)
        return GS_DEV_CUR;
    return dst ? side(m->dstMemoryType, m->dstDevice, NULL, ask) : side(m->srcMemoryType, m->srcDevice, NULL, ask);
}

int gs_dev_of_m3dpeer(const CUDA_MEMCPY3D_PEER *m, int dst, int ask)
{
    if (m == NULL)
        return GS_DEV_CUR;
    return dst ? side(m->dstMemoryType, m->dstDevice, m->dstContext, ask)
               : side(m->srcMemoryType, m->srcDevice, m->srcContext, ask);
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
