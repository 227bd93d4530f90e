"""One data-parallel job: two processes, one per GPU, each a matmul step then an NCCL all-reduce of the
result, for --steps steps. Prints one JSON line per rank with its wall time (first step excluded: NCCL's
and cuBLAS's setup) and the sha256 of its final tensor, which must be bit-identical however the job was
scheduled: the all-reduce of two ranks adds the same two fp32 values in any order, and the matmul runs
one cuBLAS algorithm (TF32 off, deterministic algorithms on).

    python3 allreduce.py --job a --seed 1 --port 29511 --steps 400
"""
import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    g = torch.Generator(device="cuda").manual_seed(args.seed * 100 + rank)
    n = args.size
    w = torch.randn(n, n, device="cuda", generator=g) / n**0.5
    x = torch.randn(n, n, device="cuda", generator=g)
    # The all-reduce payload: x, padded to --elems with values every rank sets alike.
    grad = torch.zeros(max(args.elems, n * n), device="cuda")
    start = None
    for step in range(args.steps):
        if step == 1:
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
        x = torch.tanh(w @ x)
        grad[: x.numel()].copy_(x.flatten())
        dist.all_reduce(grad)
        x = x + grad[: x.numel()].view_as(x) * 1e-3
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    digest = hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest()
    print(json.dumps({"job": args.job, "rank": rank, "steps": args.steps, "seconds": round(seconds, 3), "sha256": digest}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--size", type=int, default=4096, help="matmul side")
    p.add_argument("--elems", type=int, default=64 << 20, help="all-reduce elements (fp32)")
    args = p.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs two GPUs visible")
    mp.spawn(rank_main, args=(args,), nprocs=2, join=True)


if __name__ == "__main__":
    main()
