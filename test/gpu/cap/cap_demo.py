"""One PyTorch process under a memory limit: what it sees and what happens past the limit.

  cap_demo.py --name A --fill      allocate 512 MiB tensors until torch.OutOfMemoryError, then write
                                   DIR/A.oom and exit 0 (a clean error, caught)
  cap_demo.py --name B --hold GIB  allocate GIB, then run matmuls until DIR/A.oom exists and 200
                                   steps more (it kept running while A hit its limit), then exit 0
Both print torch.cuda.mem_get_info() and NVML's nvmlDeviceGetMemoryInfo (through ctypes, as pynvml
does) first, one JSON line per event.
"""
import argparse
import ctypes
import json
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--name", required=True)
p.add_argument("--dir", required=True)
p.add_argument("--fill", action="store_true")
p.add_argument("--hold", type=float, default=0)
a = p.parse_args()


def say(**kw):
    print(json.dumps({"proc": a.name, **kw}), flush=True)


free, total = torch.cuda.mem_get_info()
say(event="mem_get_info", free=free, total=total)
# Under MPS the client's active-thread percentage shows here (the SMs its kernels may use).
say(event="device", sms=torch.cuda.get_device_properties(0).multi_processor_count)


class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


try:
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    nv.nvmlInit_v2()
    h = ctypes.c_void_p()
    nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
    m = Mem()
    r = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
    say(event="nvml", ret=r, total=m.total, free=m.free, used=m.used)
except OSError as e:
    say(event="nvml", error=str(e))

if a.fill:
    held = []
    try:
        while True:
            held.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        say(event="oom", allocated_gib=len(held) / 2, error=str(e).splitlines()[0][:160])
    open(os.path.join(a.dir, a.name + ".oom"), "w").close()
    held.clear()
    x = torch.ones(1 << 20, device="cuda")  # still usable after the error
    say(event="after_oom", ok=bool(x.sum().item() == (1 << 20)))
else:
    ballast = torch.empty(int(a.hold * (1 << 30)), dtype=torch.uint8, device="cuda")
    x = torch.randn(2048, 2048, device="cuda")
    steps, after, t0 = 0, -1, time.time()
    while after < 200 and time.time() - t0 < 120:
        x = torch.tanh(x @ x)
        torch.cuda.synchronize()
        steps += 1
        if after >= 0:
            after += 1
        elif os.path.exists(os.path.join(a.dir, "A.oom")):
            after = 0
    say(event="kept_running", steps=steps, steps_after_a_oom=after, ok=after >= 200 and bool(torch.isfinite(x).all()))
