"""One figure of test/gpu/capacity/measure.sh: python3 memory.py idle|cupy|torch|torch-mps.

Prints one line: what NVML counts for this process (its context, nothing allocated by it) and, under MPS,
for the MPS server, in MiB."""
import os
import sys

import pynvml

MIB = 1 << 20


def per_process(h):
    return {p.pid: (p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}


def main(kind):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    if kind == "idle":
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        print(f"idle GPU: total {m.total // MIB} MiB, reserved {m.reserved // MIB} MiB, "
              f"free {m.free // MIB} MiB, used {m.used // MIB} MiB; "
              f"total - reserved = {(m.total - m.reserved) // MIB} MiB")
        return
    if kind == "cupy":
        import cupy
        cupy.cuda.runtime.setDevice(0)
        cupy.cuda.Device(0).synchronize()
        held = 0
    else:
        import torch
        x = torch.ones(1 << 20, device="cuda")  # 4 MiB, in a 20 MiB caching-allocator segment
        (x * 2).sum().item()
        held = torch.cuda.memory_reserved()
    procs = per_process(h)
    if kind.endswith("-mps"):
        print(f"{kind}: NVML lists " + ", ".join(f"pid {p} {u // MIB} MiB" + (" (this process)" if p == os.getpid() else "")
                                              for p, u in sorted(procs.items())))
    mine = procs.get(os.getpid())
    if mine is None:
        # An MPS client does not appear in NVML's list; the server does, holding its clients' memory.
        server = sum(procs.values())
        print(f"{kind}: this process not listed by NVML (MPS client); everything NVML lists (the MPS server) "
              f"{server // MIB} MiB with {held // MIB} MiB allocated by the client")
        return
    print(f"{kind}: NVML {mine // MIB} MiB for the process, {held // MIB} MiB allocated by it, "
          f"context {(mine - held) // MIB} MiB")


if __name__ == "__main__":
    main(sys.argv[1])
