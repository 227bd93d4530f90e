"""An MPS client for the GPU machine's test: allocates device memory in 256 MiB pieces (plain
cudaMalloc through PyTorch's allocator, never managed memory) up to a cap, reports how far it got, and
stays connected for a moment so the agent can count it as a client (a negative hold: until its stdin
closes, so a test decides when the client ends)."""
import json
import os
import sys
import time

import torch

cap_mib = int(sys.argv[1])
hold_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
piece = 256
t0 = time.time()
torch.cuda.init()
x = torch.empty(1, device="cuda")  # open the context (connects to the MPS server)
ctx_s = time.time() - t0
# Under an MPS pinned limit mem_get_info reports the limit, not the GPU: record it as evidence. The
# cap comes from run.sh, which sized it from the GPU's real free memory (nvidia-smi).
free, total = torch.cuda.mem_get_info()
held, got, oom = [], 0, None
while got + piece <= cap_mib:
    try:
        held.append(torch.empty(piece << 20, dtype=torch.uint8, device="cuda"))
        got += piece
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0]
        break
torch.cuda.synchronize()
print(json.dumps({"allocated_mib": got, "cap_mib": cap_mib, "oom": oom, "context_s": round(ctx_s, 3),
                  "mem_get_info_free_mib": free >> 20, "mem_get_info_total_mib": total >> 20, "pid": os.getpid()}), flush=True)
if hold_s < 0:
    sys.stdin.read()
else:
    time.sleep(hold_s)
