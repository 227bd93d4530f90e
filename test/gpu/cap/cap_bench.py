"""The memory limit's cost, one process's share of the benchmark (run.sh runs it capped and not).

Two timed workloads, each after a warm-up, as the median of --reps timed blocks:
  alloc  PYTORCH_NO_CUDA_MEMORY_CACHING=1 (set by run.sh): every tensor is a cuMemAlloc and every
         free a cuMemFree, so each block of --alloc-iters steps makes 2 x 24 allocation calls a step
         (sizes 4 KiB .. 32 MiB) around a small matmul
  train  a normal training step (caching allocator): a 4-layer MLP, batch 512, forward, backward, AdamW
Prints one JSON line: {"alloc_ms": median ms per step, "train_ms": ...}.
"""
import argparse
import json
import os
import statistics
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["alloc", "train"], required=True)
p.add_argument("--reps", type=int, default=7)
p.add_argument("--iters", type=int, default=200)
a = p.parse_args()
dev = torch.device("cuda")
torch.manual_seed(0)


def alloc_step(x):
    keep = []
    for i in range(24):
        n = 1024 << (i % 14)  # 4 KiB .. 32 MiB of float32
        t = torch.empty(n, device=dev)
        t.fill_(1.0)
        keep.append(t)
    y = x @ x
    del keep
    return y


def make_train():
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(),
        torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    xb = torch.randn(512, 2048, device=dev)
    yb = torch.randn(512, 1024, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        return loss
    return step


def timed(fn, iters):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


if a.mode == "alloc":
    x = torch.randn(256, 256, device=dev)
    fn = lambda: alloc_step(x)  # noqa: E731
else:
    fn = make_train()
timed(fn, a.iters // 4)  # warm-up: kernels loaded, cuBLAS workspace made
blocks = [timed(fn, a.iters) for _ in range(a.reps)]
print(json.dumps({a.mode + "_ms": statistics.median(blocks), "blocks": [round(b, 4) for b in blocks],
                  "limit": os.environ.get("GPUSHARE_MEMORY_LIMIT_BYTES", "")}))
