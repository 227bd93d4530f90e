"""Holds device memory on GPU 0 for a while: the process test/gpu/unmanaged/run.sh starts three times
(under the shim, as a pod without LD_PRELOAD, as a host process).

    python3 workload.py [BYTES] [SECONDS]
"""
import os
import sys
import time

import torch

size = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
hold = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
x = torch.empty(size, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print(f"ready pid={os.getpid()} bytes={size} at={time.time():.3f}", flush=True)
time.sleep(hold)
print(f"done pid={os.getpid()} sum={int(x[:1024].sum())}", flush=True)
