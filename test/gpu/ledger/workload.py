"""One process of a claim's ledger, for test/gpu/ledger/run.sh. Prints one JSON line when done, then
waits for a line on stdin (so that NVML can be read while it holds its memory) and exits.

  workload.py fill    allocate exactly what torch.cuda.mem_get_info() offers (1 GiB tensors, then the
                      rest in 2 MiB steps, PyTorch's caching allocator off so no byte is kept back),
                      then 64 MiB more, which must fail: {"free", "total", "got", "over_refused",
                      "ctx_refused": false}; a CUDA context the claim has no room for is refused with out
                      of memory at CUDA's initialization: {"ctx_refused": true, "error"}
  workload.py ready-fill  create the CUDA context first and print {"ready": true}, then wait for a line on
                      stdin before it fills as fill does
  workload.py vmm     NVIDIA's vectorAddMMAP pattern through the driver API (ctypes): cuMemCreate of
                      the allocation granularity rounded to 256 MiB, cuMemMap, cuMemRelease at once,
                      repeated until refused (at most 24): {"mapped_bytes", "pieces", "refused"}
"""
import ctypes
import json
import os
import sys

import torch

MIB = 1 << 20


def refused_for_memory(e):
    """torch raises OutOfMemoryError from its caching allocator but AcceleratorError (a RuntimeError) from
    a plain cudaMalloc refused with cudaErrorMemoryAllocation, as with the caching allocator off."""
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def fill():
    try:
        free, total = torch.cuda.mem_get_info()  # the first CUDA call: creates the primary context
    except RuntimeError as e:
        if not refused_for_memory(e):
            raise
        return {"ctx_refused": True, "error": str(e).splitlines()[0]}, None
    held, got = [], 0
    left = free
    for step in (1 << 30, 2 * MIB):
        while left >= step:
            try:
                held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
            except RuntimeError as e:
                if not refused_for_memory(e):
                    raise
                break
            got += step
            left -= step
    refused = False
    try:
        held.append(torch.empty(64 * MIB, dtype=torch.uint8, device="cuda"))
    except RuntimeError as e:
        if not refused_for_memory(e):
            raise
        refused = True
    return {"free": free, "total": total, "got": got, "over_refused": refused, "ctx_refused": False}, held


def ready_fill():
    torch.cuda.synchronize()  # the primary context, nothing allocated
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    sys.stdin.readline()
    return fill()


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("locType", ctypes.c_int),
                ("locId", ctypes.c_int), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


def vmm():
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    cu = ctypes.CDLL("libcuda.so.1")
    prop = Prop(type=1, locType=1, locId=0)  # pinned, on device 0
    gran = ctypes.c_size_t()
    assert cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0) == 0
    piece = ((256 * MIB + gran.value - 1) // gran.value) * gran.value
    most = 24
    va = ctypes.c_uint64()
    assert cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(piece * most), ctypes.c_size_t(0),
                                  ctypes.c_uint64(0), ctypes.c_ulonglong(0)) == 0
    n, refused = 0, False
    for i in range(most):
        h = ctypes.c_uint64()
        if cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(piece), ctypes.byref(prop), ctypes.c_ulonglong(0)) != 0:
            refused = True
            break
        assert cu.cuMemMap(ctypes.c_uint64(va.value + i * piece), ctypes.c_size_t(piece), ctypes.c_size_t(0), h,
                           ctypes.c_ulonglong(0)) == 0
        assert cu.cuMemRelease(h) == 0
        n += 1
    return {"mapped_bytes": n * piece, "pieces": n, "refused": refused}, None


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    out, keep = {"fill": fill, "ready-fill": ready_fill, "vmm": vmm}[sys.argv[1]]()
    out["pid"] = os.getpid()
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
