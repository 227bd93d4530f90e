"""A PyTorch workload whose memory peak is set: it allocates PEAK_MIB of tensors in 64 MiB pieces, runs
matmuls over part of them for SECONDS, frees them and exits 0; an allocation refused (out of memory) exits
3. Its NVML figure is the tensors plus the CUDA context and the caching allocator's rounding."""
import os
import sys
import time

import torch

peak_mib = int(os.environ.get("PEAK_MIB", "3072"))
seconds = float(os.environ.get("SECONDS_RUN", "6"))
dev = torch.device("cuda", 0)
try:
    pieces = [torch.empty(64 << 20, dtype=torch.uint8, device=dev) for _ in range(peak_mib // 64)]
    a = torch.randn(2048, 2048, device=dev)
    end = time.time() + seconds
    while time.time() < end:
        a = a @ a
        a = a / a.norm()
    torch.cuda.synchronize()
except torch.OutOfMemoryError as e:
    print("out of memory:", e, flush=True)
    sys.exit(3)
except RuntimeError as e:
    if "out of memory" in str(e).lower():
        print("out of memory:", e, flush=True)
        sys.exit(3)
    raise
print(f"held {len(pieces) * 64} MiB of tensors, reserved {torch.cuda.max_memory_reserved() >> 20} MiB", flush=True)
